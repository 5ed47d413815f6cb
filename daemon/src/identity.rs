//! Who is asking: the tokens the daemon accepts ([`Credential`]) and the identity a request
//! or connection carries once one matched ([`Identity`]). A leaf: the config reads credentials,
//! the server checks them, the node state records identities on acknowledgements, and none of
//! them needs the others for it.

use ringside_shared::Role;

/// A named token and what it may do.
#[derive(Debug, Clone, PartialEq)]
pub struct Credential {
    pub name: String,
    pub secret: String,
    pub role: Role,
}

/// Who a request is from: the name and role of the token it carried.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    pub name: String,
    pub role: Role,
}
