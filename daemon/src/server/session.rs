//! Console sessions: the first visit with `?token=` exchanges the token for a random session id,
//! which the browser keeps in a cookie named after the daemon's port
//! (`ringside_session_<port>`; `__Host-ringside_session_<port>` over HTTPS, which a browser
//! binds to this host and scheme, never a subdomain's, and sends only over HTTPS). The cookie
//! never carries the token itself, so other services on the host (which, without TLS, receive
//! every cookie for the host, whatever their port) never see the token, and two daemons on one
//! host keep their sessions apart.
//!
//! Sessions are kept in `<data dir>/sessions` (`0600`) as SHA-256 digests only — of the id, and
//! of the secret of the token it was made from — so the file gives neither a usable session nor
//! a token. A session is valid while it has not expired (30 days at most, and `idle` without
//! use), its token is still configured with the same secret (rotating the token ends every
//! session made from the old one), and nobody ended it (signing out ends one; an operator may
//! end every session of a token). At most [`MAX_SESSIONS`] are kept, [`MAX_PER_TOKEN`] per token:
//! a token's new session pushes out that token's oldest, so that many sign-ins with one token (a
//! viewer's) never push out another token's sessions.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use axum::http::{header, HeaderMap, HeaderValue};
use sha2::{Digest, Sha256};

use crate::identity::{same_secret, Credential};

/// The sessions file in the data dir.
pub const FILE: &str = "sessions";
/// Sessions kept at most, and per token.
pub const MAX_SESSIONS: usize = 256;
pub const MAX_PER_TOKEN: usize = 64;
/// How long a session (and its cookie) lasts at most: 30 days.
pub const SESSION_TTL_MS: u64 = 30 * 24 * 3600 * 1000;
/// A session's last use is written to the file at most this often (it is kept in memory).
const USE_WRITTEN_EVERY_MS: u64 = 10 * 60 * 1000;
/// The sessions file read at most (256 sessions are about 40 KiB).
const MAX_FILE_BYTES: u64 = 1 << 20;

#[derive(Clone, PartialEq, Eq, Debug)]
struct Session {
    id_digest: [u8; 32],
    expires_ms: u64,
    /// When a request last came with it, and when that was last written to the file.
    used_ms: u64,
    written_used_ms: u64,
    /// The name of the token it was made from.
    name: String,
    secret_digest: [u8; 32],
}

pub struct Sessions {
    file: Option<PathBuf>,
    cookie_name: String,
    kept: Mutex<Vec<Session>>,
    /// Served over HTTPS: the cookie is `Secure` (never sent over plain HTTP) and `__Host-`.
    secure: bool,
    /// A session unused this long ends.
    idle_ms: u64,
}

/// What a request's session cookie is: a session of a configured token, or a cookie that names
/// no session (ended, expired, or never one).
#[derive(Debug, PartialEq)]
pub enum Presented<'a> {
    None,
    Valid(&'a Credential),
    Invalid,
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
        Sessions {
            file,
            cookie_name: format!("ringside_session_{port}"),
            kept: Mutex::new(kept),
            secure: false,
            idle_ms: SESSION_TTL_MS,
        }
    }

    /// Cookies marked `Secure` and named `__Host-…` (the daemon serves HTTPS).
    pub fn secure(mut self, secure: bool) -> Sessions {
        self.secure = secure;
        if secure && !self.cookie_name.starts_with("__Host-") {
            self.cookie_name = format!("__Host-{}", self.cookie_name);
        }
        self
    }

    /// Sessions unused for `idle_ms` end.
    pub fn idle(mut self, idle_ms: u64) -> Sessions {
        self.idle_ms = idle_ms.clamp(60_000, SESSION_TTL_MS);
        self
    }

    pub fn cookie_name(&self) -> &str {
        &self.cookie_name
    }

    fn live(&self, session: &Session, now_ms: u64) -> bool {
        session.expires_ms > now_ms && session.used_ms.saturating_add(self.idle_ms) > now_ms
    }

    /// Writes the sessions file (where there is one); a file that cannot be written leaves the
    /// sessions in memory (they end with the daemon) and says so.
    fn keep(&self, snapshot: &[Session]) {
        if let Some(path) = &self.file {
            if let Err(e) = write(path, snapshot) {
                tracing::warn!("sessions file {}: {e}; sessions are kept in memory only", path.display());
            }
        }
    }

    /// A new session for `credential`: its id (for the cookie). Kept before it is returned.
    pub fn create(&self, credential: &Credential, now_ms: u64) -> std::io::Result<String> {
        let id = crate::identity::generate_token()?;
        let session = Session {
            id_digest: digest(id.as_bytes()),
            expires_ms: now_ms + SESSION_TTL_MS,
            used_ms: now_ms,
            written_used_ms: now_ms,
            name: credential.name.clone(),
            secret_digest: digest(credential.secret.as_bytes()),
        };
        let snapshot = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            kept.retain(|s| self.live(s, now_ms));
            // The token's own oldest go first; past the total, the oldest of the token holding
            // the most.
            let of_token = |kept: &Vec<Session>| kept.iter().filter(|s| s.name == session.name).count();
            while of_token(&kept) >= MAX_PER_TOKEN {
                if let Some(at) = kept.iter().position(|s| s.name == session.name) {
                    kept.remove(at);
                }
            }
            while kept.len() >= MAX_SESSIONS {
                let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
                for s in kept.iter() {
                    *counts.entry(s.name.as_str()).or_default() += 1;
                }
                let Some(largest) = counts.into_iter().max_by_key(|(_, n)| *n).map(|(name, _)| name.to_string()) else {
                    break;
                };
                if let Some(at) = kept.iter().position(|s| s.name == largest) {
                    kept.remove(at);
                }
            }
            kept.push(session);
            kept.clone()
        };
        self.keep(&snapshot);
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

    /// `Set-Cookie` that makes the browser forget its session cookie.
    pub fn cleared_cookie(&self) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!("{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}", self.cookie_name);
        HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("ringside_session=; Max-Age=0"))
    }

    /// The digests of this daemon's session cookies a request carries (16 at most).
    fn presented_ids(&self, headers: &HeaderMap) -> Vec<[u8; 32]> {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().strip_prefix(self.cookie_name.as_str())?.strip_prefix('='))
            .take(16)
            .map(|id| digest(id.trim().as_bytes()))
            .collect()
    }

    /// The credential a request's session cookie stands for. Every cookie of this daemon's
    /// name is tried (a browser may hold several, for other paths or an older session); each
    /// is compared with every session, in equal time. A session found is marked used.
    pub fn credential<'a>(
        &self,
        headers: &HeaderMap,
        credentials: &'a [Credential],
        now_ms: u64,
    ) -> Option<&'a Credential> {
        match self.presented(headers, credentials, now_ms) {
            Presented::Valid(credential) => Some(credential),
            Presented::None | Presented::Invalid => None,
        }
    }

    /// What a request's session cookie is (see [`Presented`]).
    pub fn presented<'a>(&self, headers: &HeaderMap, credentials: &'a [Credential], now_ms: u64) -> Presented<'a> {
        let ids = self.presented_ids(headers);
        if ids.is_empty() {
            return Presented::None;
        }
        let (found, snapshot) = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let mut found = None;
            for id in &ids {
                for (i, session) in kept.iter().enumerate() {
                    if same_secret(id, &session.id_digest) && self.live(session, now_ms) {
                        found = Some(i);
                    }
                }
            }
            let Some(i) = found else { return Presented::Invalid };
            let session = &mut kept[i];
            session.used_ms = session.used_ms.max(now_ms);
            // The last use reaches the file now and then, so that idle expiry holds across a
            // restart without a write per request.
            let write = session.used_ms.saturating_sub(session.written_used_ms) >= USE_WRITTEN_EVERY_MS;
            if write {
                session.written_used_ms = session.used_ms;
            }
            (kept[i].clone(), write.then(|| kept.clone()))
        };
        if let Some(snapshot) = snapshot {
            self.keep(&snapshot);
        }
        let mut matched = None;
        for credential in credentials {
            if credential.name == found.name && same_secret(&digest(credential.secret.as_bytes()), &found.secret_digest)
            {
                matched = Some(credential);
            }
        }
        matched.map_or(Presented::Invalid, Presented::Valid)
    }

    /// Ends the sessions a request's cookies name; how many.
    pub fn end_presented(&self, headers: &HeaderMap) -> usize {
        let ids = self.presented_ids(headers);
        self.end_where(|s| ids.iter().any(|id| same_secret(id, &s.id_digest)))
    }

    /// Ends every session made from the token named `name`; how many.
    pub fn end_token(&self, name: &str) -> usize {
        self.end_where(|s| s.name == name)
    }

    fn end_where(&self, ends: impl Fn(&Session) -> bool) -> usize {
        let (ended, snapshot) = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let before = kept.len();
            kept.retain(|s| !ends(s));
            (before - kept.len(), kept.clone())
        };
        if ended > 0 {
            self.keep(&snapshot);
        }
        ended
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().unwrap().len()
    }
}

/// One session a line: `<id digest> <expires, Unix ms> <secret digest> <last used, Unix ms>
/// <token name>`; files of earlier versions, without the last use, are read too.
fn parse(text: &str, now_ms: u64) -> Vec<Session> {
    let mut sessions: Vec<Session> = text
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(4, ' ');
            let id_digest = unhex(fields.next()?)?;
            let expires_ms: u64 = fields.next()?.parse().ok()?;
            let secret_digest = unhex(fields.next()?)?;
            let rest = fields.next()?;
            let (used_ms, name) = match rest.split_once(' ') {
                Some((used, name)) if used.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
                    (used.parse().ok()?, name.to_string())
                }
                _ => (now_ms, rest.to_string()),
            };
            (expires_ms > now_ms).then_some(Session {
                id_digest,
                expires_ms,
                used_ms,
                written_used_ms: used_ms,
                name,
                secret_digest,
            })
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
        .map(|s| {
            format!(
                "{} {} {} {} {}\n",
                hex(&s.id_digest),
                s.expires_ms,
                hex(&s.secret_digest),
                s.written_used_ms,
                s.name
            )
        })
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

        // Bounded per token: the token's oldest go first.
        for _ in 0..MAX_PER_TOKEN + 5 {
            again.create(&ops, 4_000).unwrap();
        }
        assert_eq!(again.len(), MAX_PER_TOKEN);
        assert!(again.credential(&mine, &creds, 4_000).is_none(), "the first session was pushed out");
        // A damaged file: the good lines are kept.
        std::fs::write(&file, format!("garbage\n{}", std::fs::read_to_string(&file).unwrap())).unwrap();
        assert_eq!(Sessions::load(Some(file), 8080, 4_000).len(), MAX_PER_TOKEN);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_signing_in_over_and_over_pushes_out_only_its_own_sessions() {
        let sessions = Sessions::load(None, 8080, 0);
        let ops = credential("ops", "s3cret-s3cret-s3cret");
        let viewer = Credential { role: Role::Viewer, ..credential("viewer", "v1ewer-v1ewer-v1ewer") };
        let kept: Vec<String> = (0..3).map(|_| sessions.create(&ops, 1_000).unwrap()).collect();
        for _ in 0..300 {
            sessions.create(&viewer, 2_000).unwrap();
        }
        let creds = [ops.clone(), viewer.clone()];
        for id in &kept {
            let headers = cookie(&format!("ringside_session_8080={id}"));
            assert_eq!(sessions.credential(&headers, &creds, 3_000).map(|c| c.name.as_str()), Some("ops"));
        }
        assert_eq!(sessions.len(), 3 + MAX_PER_TOKEN);
    }

    #[test]
    fn sessions_end_when_idle_when_signed_out_and_when_their_token_is_ended() {
        let dir = crate::test_support::ScratchDir::new("sessions-end");
        let file = dir.path().join("sessions");
        let hour = 3_600_000;
        let sessions = Sessions::load(Some(file.clone()), 8080, 0).idle(12 * hour);
        let ops = credential("ops", "s3cret-s3cret-s3cret");
        let creds = [ops.clone()];
        let a = sessions.create(&ops, 0).unwrap();
        let b = sessions.create(&ops, 0).unwrap();
        let c = sessions.create(&ops, 0).unwrap();
        let (ha, hb, hc) = (
            cookie(&format!("ringside_session_8080={a}")),
            cookie(&format!("ringside_session_8080={b}")),
            cookie(&format!("ringside_session_8080={c}")),
        );
        // Used at 11 h: lives on past 12 h; b, unused, ends at 12 h.
        assert!(sessions.credential(&ha, &creds, 11 * hour).is_some());
        assert!(sessions.credential(&hb, &creds, 12 * hour).is_none());
        assert_eq!(sessions.presented(&hb, &creds, 12 * hour), Presented::Invalid);
        assert!(sessions.credential(&ha, &creds, 20 * hour).is_some());
        // The last use reached the file: after a restart, a stays, idle from its last use.
        let again = Sessions::load(Some(file.clone()), 8080, 21 * hour).idle(12 * hour);
        assert!(again.credential(&ha, &creds, 21 * hour).is_some());
        // Signing out ends the session the cookie names, no other.
        assert!(again.credential(&hc, &creds, 21 * hour).is_none(), "c was idle too");
        let d = again.create(&ops, 21 * hour).unwrap();
        let hd = cookie(&format!("ringside_session_8080={d}"));
        assert_eq!(again.end_presented(&ha), 1);
        assert!(again.credential(&ha, &creds, 21 * hour).is_none());
        assert!(again.credential(&hd, &creds, 21 * hour).is_some());
        // Ending a token's sessions ends every one of them, kept in the file too.
        assert_eq!(again.end_token("ops"), 1);
        assert!(again.credential(&hd, &creds, 21 * hour).is_none());
        assert_eq!(Sessions::load(Some(file), 8080, 21 * hour).len(), 0);
    }

    #[test]
    fn over_https_the_cookie_is_host_bound_and_secure() {
        let sessions = Sessions::load(None, 9650, 0).secure(true);
        assert_eq!(sessions.cookie_name(), "__Host-ringside_session_9650");
        let set = sessions.cookie("abc").to_str().unwrap().to_string();
        assert!(set.starts_with("__Host-ringside_session_9650=abc; Path=/;") && set.ends_with("; Secure"), "{set}");
        assert!(!set.contains("Domain"), "{set}");
        let cleared = sessions.cleared_cookie().to_str().unwrap().to_string();
        assert!(cleared.contains("Max-Age=0") && cleared.starts_with("__Host-"), "{cleared}");
    }
}
