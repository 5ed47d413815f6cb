//! Who is asking: the tokens the daemon accepts ([`Credential`]) and the identity a request
//! or connection carries once one matched ([`Identity`]), and how secrets are compared
//! ([`same_secret`]). A leaf: the config reads credentials,
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

/// Equal-time comparison of two byte strings.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        difference |= x ^ b.get(i).copied().unwrap_or(0);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare() {
        assert!(same_secret(b"abcdef", b"abcdef"));
        assert!(!same_secret(b"abcdef", b"abcdeg"));
        assert!(!same_secret(b"abc", b"abcdef"));
        assert!(!same_secret(b"abcdef", b"abc"));
        assert!(!same_secret(b"", b"a"));
    }
}
