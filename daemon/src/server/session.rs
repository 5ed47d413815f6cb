//! Console sessions: the first visit with `?token=` exchanges the token for a random session id,
//! which the browser keeps in a cookie named after the daemon's port
//! (`ringside_session_<port>`). The cookie never carries the token itself, so other services
//! on the host (which receive every cookie for the host, whatever their port) never see it, and
//! two daemons on one host keep their sessions apart.
//!
//! Sessions are kept in `<data dir>/sessions` (`0600`) as SHA-256 digests only — of the id, and
//! of the secret of the token it was made from — so the file gives neither a usable session nor
//! a token. A session is valid while it has not expired and its token is still configured with
//! the same secret: rotating the token file (and restarting) ends every session made from the
//! old one. At most [`MAX_SESSIONS`] are kept; a new one pushes out the oldest.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::identity::{same_secret, Credential};

/// The sessions file in the data dir.
pub const FILE: &str = "sessions";
/// Sessions kept at most.
pub const MAX_SESSIONS: usize = 256;
/// How long a session (and its cookie) lasts: 30 days.
pub const SESSION_TTL_MS: u64 = 30 * 24 * 3600 * 1000;
/// The sessions file read at most (256 sessions are about 40 KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Clone, PartialEq, Eq, Debug)]
struct Session {
    id_digest: [u8; 32],
    expires_ms: u64,
    /// The name of the token it was made from.
    name: String,
    secret_digest: [u8; 32],
}

pub struct Sessions {
    file: Option<PathBuf>,
    cookie_name: String,
    kept: Mutex<Vec<Session>>,
    /// Served over HTTPS: the cookie is `Secure` (never sent over plain HTTP).
    secure: bool,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Sessions {
    /// The sessions kept in `file` (none if it is missing or unreadable: the console then asks
    /// for the token again), for a daemon listening on `port`. `None`: kept in memory only.
    pub fn load(file: Option<PathBuf>, port: u16, now_ms: u64) -> Sessions {
        let mut kept = Vec::new();
        if let Some(path) = &file {
            let mut text = String::new();
            let read = std::fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES).read_to_string(&mut text));
            match read {
                Ok(_) => kept = parse(&text, now_ms),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("sessions file {}: {e}; console sessions start afresh", path.display()),
            }
        }
        Sessions { file, cookie_name: format!("ringside_session_{port}"), kept: Mutex::new(kept), secure: false }
    }

    /// Cookies marked `Secure` (the daemon serves HTTPS).
    pub fn secure(mut self, secure: bool) -> Sessions {
        self.secure = secure;
        self
    }

    pub fn cookie_name(&self) -> &str {
        &self.cookie_name
    }

    /// A new session for `credential`: its id (for the cookie). Kept before it is returned; a
    /// file that cannot be written leaves it in memory (it ends with the daemon) and says so.
    pub fn create(&self, credential: &Credential, now_ms: u64) -> std::io::Result<String> {
        let id = crate::config::generate_token().map_err(|e| std::io::Error::other(e.to_string()))?;
        let session = Session {
            id_digest: digest(id.as_bytes()),
            expires_ms: now_ms + SESSION_TTL_MS,
            name: credential.name.clone(),
            secret_digest: digest(credential.secret.as_bytes()),
        };
        let snapshot = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            kept.retain(|s| s.expires_ms > now_ms);
            kept.push(session);
            let excess = kept.len().saturating_sub(MAX_SESSIONS);
            kept.drain(..excess);
            kept.clone()
        };
        if let Some(path) = &self.file {
            if let Err(e) = write(path, &snapshot) {
                tracing::warn!("sessions file {}: {e}; this session ends when the daemon stops", path.display());
            }
        }
        Ok(id)
    }

    /// `Set-Cookie` for a session id.
    pub fn cookie(&self, id: &str) -> HeaderValue {
        let max_age = SESSION_TTL_MS / 1000;
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!("{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}", self.cookie_name);
        // The id is hex and the name `ringside_session_<digits>`: always a valid header value.
        HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("ringside_session=invalid; Path=/"))
    }

    /// The credential a request's session cookie stands for. Every cookie of this daemon's
    /// name is tried (a browser may hold several, for other paths or an older session); each
    /// is compared with every session, in equal time.
    pub fn credential<'a>(
        &self,
        headers: &HeaderMap,
        credentials: &'a [Credential],
        now_ms: u64,
    ) -> Option<&'a Credential> {
        let ids: Vec<[u8; 32]> = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().strip_prefix(self.cookie_name.as_str())?.strip_prefix('='))
            .take(16)
            .map(|id| digest(id.trim().as_bytes()))
            .collect();
        if ids.is_empty() {
            return None;
        }
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for id in &ids {
            for session in kept.iter() {
                if same_secret(id, &session.id_digest) && session.expires_ms > now_ms {
                    found = Some(session.clone());
                }
            }
        }
        let session = found?;
        let mut matched = None;
        for credential in credentials {
            if credential.name == session.name
                && same_secret(&digest(credential.secret.as_bytes()), &session.secret_digest)
            {
                matched = Some(credential);
            }
        }
        matched
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().unwrap().len()
    }
}

/// One session a line: `<id digest> <expires, Unix ms> <secret digest> <token name>`.
fn parse(text: &str, now_ms: u64) -> Vec<Session> {
    let mut sessions: Vec<Session> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, ' ');
            let id_digest = unhex(fields.next()?)?;
            let expires_ms: u64 = fields.next()?.parse().ok()?;
            let secret_digest = unhex(fields.next()?)?;
            let name = fields.next()?.to_string();
            (expires_ms > now_ms).then_some(Session { id_digest, expires_ms, name, secret_digest })
        })
        .collect();
    let excess = sessions.len().saturating_sub(MAX_SESSIONS);
    sessions.drain(..excess);
    sessions
}

/// Writes the sessions next to `path` and renames the file into place (`0600`).
fn write(path: &Path, sessions: &[Session]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let text: String = sessions
        .iter()
        .map(|s| format!("{} {} {} {}\n", hex(&s.id_digest), s.expires_ms, hex(&s.secret_digest), s.name))
        .collect();
    let partial = path.with_extension("partial");
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&partial)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringside_shared::Role;

    fn credential(name: &str, secret: &str) -> Credential {
        Credential { name: name.into(), secret: secret.into(), role: Role::Operator }
    }

    fn cookie(pairs: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_str(pairs).unwrap());
        headers
    }

    #[test]
    fn a_session_stands_for_its_token_until_it_expires_or_the_token_changes() {
        let dir = std::env::temp_dir().join(format!("ringside-sessions-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sessions");
        let ops = credential("ops", "s3cret-s3cret-s3cret");
        let sessions = Sessions::load(Some(file.clone()), 8080, 1_000);
        let id = sessions.create(&ops, 1_000).unwrap();
        assert_eq!(id.len(), 64);
        let set = sessions.cookie(&id).to_str().unwrap().to_string();
        assert!(set.starts_with(&format!("ringside_session_8080={id};")) && set.contains("HttpOnly"), "{set}");
        let creds = [credential("viewer", "other-other-other-other"), ops.clone()];
        let mine = cookie(&format!("theme=dark; ringside_session_8080=nope; ringside_session_8080={id}"));
        assert_eq!(
            sessions.credential(&mine, &creds, 2_000).map(|c| c.name.as_str()),
            Some("ops"),
            "every cookie tried"
        );
        // Another daemon's port, the token itself, an expired session: nothing.
        assert!(sessions.credential(&cookie(&format!("ringside_session_9090={id}")), &creds, 2_000).is_none());
        assert!(sessions.credential(&cookie("ringside_session_8080=s3cret-s3cret-s3cret"), &creds, 2_000).is_none());
        assert!(sessions.credential(&mine, &creds, 1_000 + SESSION_TTL_MS).is_none());

        // The file holds digests only, and a restart keeps the session.
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(&id) && !text.contains("s3cret"), "{text}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        let again = Sessions::load(Some(file.clone()), 8080, 3_000);
        assert_eq!(again.credential(&mine, &creds, 3_000).map(|c| c.name.as_str()), Some("ops"));
        // The token file rotated: same name, new secret: the session is over.
        let rotated = [credential("ops", "n3w-n3w-n3w-n3w-n3w")];
        assert!(again.credential(&mine, &rotated, 3_000).is_none());

        // Bounded: the oldest go first.
        for _ in 0..MAX_SESSIONS + 5 {
            again.create(&ops, 4_000).unwrap();
        }
        assert_eq!(again.len(), MAX_SESSIONS);
        assert!(again.credential(&mine, &creds, 4_000).is_none(), "the first session was pushed out");
        // A damaged file: the good lines are kept.
        std::fs::write(&file, format!("garbage\n{}", std::fs::read_to_string(&file).unwrap())).unwrap();
        assert_eq!(Sessions::load(Some(file), 8080, 4_000).len(), MAX_SESSIONS);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
