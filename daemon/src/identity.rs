//! Who is asking: the tokens the daemon accepts ([`Credential`]) and the identity a request
//! or connection carries once one matched ([`Identity`]), how secrets are compared
//! ([`same_secret`]) and how a file of secrets is opened ([`open_secret_file`]). A leaf: the
//! config reads credentials,
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

/// 32 random bytes from the kernel, hex-encoded: a token or a session id.
pub fn generate_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Equal-time comparison of two byte strings.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        difference |= x ^ b.get(i).copied().unwrap_or(0);
    }
    difference == 0
}

/// Why a file of secrets (a token file, a TLS key, a password file) is not used.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("cannot open {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("{path} is a symbolic link: name the file itself, so that nobody can point it elsewhere")]
    Link { path: String },
    #[error("{path} is not a regular file")]
    NotAFile { path: String },
    #[error("{path} is owned by uid {uid}, neither root nor this daemon's user ({own}): `chown root {path}`")]
    Owner { path: String, uid: u32, own: u32 },
    #[error("{path} may be written by others (mode {mode:o}): `chmod 600 {path}`")]
    Writable { path: String, mode: u32 },
    #[error(
        "the directory of {path} may be changed by uid {uid} or by others (mode {mode:o}): keep secrets in a directory \
         only root or this daemon's user may write"
    )]
    Directory { path: String, uid: u32, mode: u32 },
}

/// Opens a file of secrets, refusing what someone else could have put or changed there: a
/// symbolic link at the end of the path (not followed: `O_NOFOLLOW`), anything but a regular
/// file, a file owned by anyone but root or this daemon's user or writable by anyone else,
/// in a directory whose owner is someone else or that others may write (sticky ones such as
/// `/tmp` too: a file there may be replaced by its owner's sibling). Who may *read* it is the
/// caller's rule. Returns the file and its metadata, read from the open file.
pub fn open_secret_file(path: &std::path::Path) -> Result<(std::fs::File, std::fs::Metadata), SecretFileError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let shown = path.display().to_string();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => SecretFileError::Link { path: shown.clone() },
            _ => SecretFileError::Open { path: shown.clone(), source },
        })?;
    let meta = file.metadata().map_err(|source| SecretFileError::Open { path: shown.clone(), source })?;
    if !meta.file_type().is_file() {
        return Err(SecretFileError::NotAFile { path: shown });
    }
    // SAFETY: geteuid has no preconditions.
    let own = unsafe { libc::geteuid() };
    let trusted = |uid: u32| uid == 0 || uid == own;
    if !trusted(meta.uid()) {
        return Err(SecretFileError::Owner { path: shown, uid: meta.uid(), own });
    }
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(SecretFileError::Writable { path: shown, mode: mode & 0o7777 });
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let dir = std::fs::metadata(&parent).map_err(|source| SecretFileError::Open { path: shown.clone(), source })?;
    let dir_mode = dir.permissions().mode();
    if !trusted(dir.uid()) || dir_mode & 0o022 != 0 {
        return Err(SecretFileError::Directory { path: shown, uid: dir.uid(), mode: dir_mode & 0o7777 });
    }
    Ok((file, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_file_is_refused_when_someone_else_could_have_put_or_changed_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::test_support::ScratchDir::new("secret-files");
        let root = dir.path();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
        let good = root.join("tokens");
        std::fs::write(&good, "secret").unwrap();
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(open_secret_file(&good).is_ok());
        // A link to it is not followed.
        let link = root.join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(matches!(open_secret_file(&link), Err(SecretFileError::Link { .. })), "{:?}", open_secret_file(&link));
        // Writable by its group or others.
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(matches!(open_secret_file(&good), Err(SecretFileError::Writable { mode: 0o620, .. })));
        std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Owned by another user (this test runs as root, as CI does, or as that user).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&good, Some(65534), None).unwrap();
            let refused = open_secret_file(&good).unwrap_err();
            assert!(matches!(refused, SecretFileError::Owner { uid: 65534, .. }), "{refused}");
            std::os::unix::fs::chown(&good, Some(0), None).unwrap();
        }
        // In a directory others may write (a sticky /tmp-like one included).
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(matches!(open_secret_file(&good), Err(SecretFileError::Directory { .. })));
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).unwrap();
        // A directory, a FIFO: not regular files (the FIFO's open does not block).
        assert!(matches!(open_secret_file(root), Err(SecretFileError::NotAFile { .. })));
        let fifo = root.join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert!(matches!(open_secret_file(&fifo), Err(SecretFileError::NotAFile { .. })));
    }

    #[test]
    fn secrets_compare() {
        assert!(same_secret(b"abcdef", b"abcdef"));
        assert!(!same_secret(b"abcdef", b"abcdeg"));
        assert!(!same_secret(b"abc", b"abcdef"));
        assert!(!same_secret(b"abcdef", b"abc"));
        assert!(!same_secret(b"", b"a"));
    }
}
