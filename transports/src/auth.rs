//! Authentication by the job token: one challenge-response construction for the rendezvous
//! store and the data connections.
//!
//! The token never goes on the wire, and neither does anything a listener could replay: every
//! proof is an HMAC-SHA256, keyed by a hash of the token, over a challenge the verifier chose
//! for this connection (store: a fresh nonce per connection; data listeners: a random
//! challenge published in the listener's handle, which only travels through the authenticated
//! store) and a nonce of the prover. A data listener remembers the nonces it accepted, so a
//! hello recorded off the wire and sent again is refused as a replay. A rank without the token
//! (a port scanner, a rank of another job that was given the same port) can neither read the
//! store nor open a data connection.
//!
//! Authentication, not secrecy: payload and store values travel in the clear, as NCCL's do.

use crate::Identity;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::Mutex;

/// Bytes of a nonce or challenge.
pub const NONCE_LEN: usize = 16;
/// Bytes of a proof (an HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// What a data connection sends after its hello: its nonce and its proof.
pub const DATA_TAIL_LEN: usize = NONCE_LEN + PROOF_LEN;

/// Separates the proofs of one protocol step from another's, so a proof captured from one
/// step cannot be presented in another.
pub mod label {
    pub const STORE_SERVER: &[u8] = b"busbw/store/server/v3";
    pub const STORE_CLIENT: &[u8] = b"busbw/store/client/v3";
    pub const DATA: &[u8] = b"busbw/data/v1";
}

/// The key every proof of one job is made with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)") // never print key material
    }
}

impl Key {
    /// The key of a job token. No token and an empty token are the same (job specs template
    /// absent values to ""): such a job still refuses builds and strangers that do not speak
    /// the protocol, but not someone who knows it is running without a token.
    pub fn from_token(token: Option<&str>) -> Key {
        let mut h = Sha256::new();
        h.update(b"busbw job token key v1\0");
        h.update(token.unwrap_or("").as_bytes());
        Key(h.finalize().into())
    }

    /// The key of one data-plane job id: every communicator (the job's, each tier group's)
    /// has its own job id, and so its own key, derived from the token key.
    pub fn for_job(&self, job: u64) -> Key {
        Key(self.proof(b"busbw/job-key/v1", &[&job.to_le_bytes()]))
    }

    /// HMAC-SHA256 of `label` and `parts`, each length-prefixed so that no two different
    /// splits of the same bytes give the same proof.
    pub fn proof(&self, label: &[u8], parts: &[&[u8]]) -> [u8; PROOF_LEN] {
        self.mac(label, parts).finalize().into_bytes().into()
    }

    /// Checks a proof in constant time.
    pub fn verify(&self, label: &[u8], parts: &[&[u8]], proof: &[u8]) -> bool {
        self.mac(label, parts).verify_slice(proof).is_ok()
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> Hmac<Sha256> {
        // new_from_slice accepts keys of any length; 32 bytes cannot fail.
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        for p in std::iter::once(label).chain(parts.iter().copied()) {
            m.update(&(p.len() as u64).to_le_bytes());
            m.update(p);
        }
        m
    }
}

/// Unpredictable bytes from the system. Falls back to a hash of the clock and pid only if
/// getrandom(2) or getentropy(3) is unavailable, which no supported system is.
pub fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    if crate::platform::Platform::active()
        .fill_random(&mut n)
        .is_err()
    {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut h = Sha256::new();
        h.update(t.to_le_bytes());
        h.update(std::process::id().to_le_bytes());
        h.update((&n as *const _ as usize).to_le_bytes());
        n.copy_from_slice(&h.finalize()[..NONCE_LEN]);
    }
    n
}

/// Lower-case hex, for challenges carried in text handles.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The inverse of [`hex`]; `None` for anything but exactly `N` bytes of hex.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let b = s.as_bytes();
    if b.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16);
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = (digit(b[2 * i])? * 16 + digit(b[2 * i + 1])?) as u8;
    }
    Some(out)
}

/// The connecting side of a data connection: what goes after the hello, proving the token
/// over the listener's `challenge` and the hello itself (rank, channel and all).
pub fn data_tail(key: &Key, challenge: &[u8; NONCE_LEN], hello: &[u8]) -> [u8; DATA_TAIL_LEN] {
    let n = nonce();
    let p = key.proof(label::DATA, &[challenge, hello, &n]);
    let mut t = [0u8; DATA_TAIL_LEN];
    t[..NONCE_LEN].copy_from_slice(&n);
    t[NONCE_LEN..].copy_from_slice(&p);
    t
}

/// The accepting side of data connections: the listener's challenge and the nonces it has
/// accepted, so a replayed hello is refused.
pub struct DataGate {
    challenge: [u8; NONCE_LEN],
    key: Key,
    seen: Mutex<HashSet<[u8; NONCE_LEN]>>,
}

impl DataGate {
    /// A gate with a fresh challenge for the listeners of `identity`.
    pub fn new(identity: &Identity) -> DataGate {
        DataGate {
            challenge: nonce(),
            key: identity.data_key(),
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// What the listener's handle carries (`auth=<hex>`).
    pub fn challenge(&self) -> &[u8; NONCE_LEN] {
        &self.challenge
    }

    /// The handle field that publishes the challenge, with its leading space.
    pub fn handle_field(&self) -> String {
        format!(" auth={}", hex(&self.challenge))
    }

    /// Reads the tail that follows `hello` on `stream` (whose read timeout bounds the wait)
    /// and checks it: the one call a listener's handshake makes, before it believes anything
    /// else the hello of a connector claiming to be `rank` says.
    pub fn admit(
        &self,
        mut stream: impl std::io::Read,
        hello: &[u8],
        rank: u32,
    ) -> Result<(), String> {
        let mut tail = [0u8; DATA_TAIL_LEN];
        stream
            .read_exact(&mut tail)
            .map_err(|e| format!("no authentication after the hello ({e})"))
            .and_then(|()| self.check(hello, &tail))
            .map_err(|why| format!("claims to be rank {rank}: {why}"))
    }

    /// Checks the tail a connection sent after `hello`. `Err` says why in words for the
    /// refusal line.
    pub fn check(&self, hello: &[u8], tail: &[u8]) -> Result<(), String> {
        check_tail(&self.key, &self.challenge, hello, tail)?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&tail[..NONCE_LEN]);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // Only proven hellos are remembered, so strangers cannot grow the set.
        if !seen.insert(nonce) {
            return Err("replayed hello (its nonce was used before)".into());
        }
        Ok(())
    }
}

/// The connecting side's one call for text handles: the tail `identity` sends after `hello`
/// to the listener of `handle`.
pub fn tail_for(
    handle: &[u8],
    identity: &Identity,
    hello: &[u8],
) -> Result<[u8; DATA_TAIL_LEN], String> {
    let challenge = challenge_in(handle)?;
    Ok(data_tail(&identity.data_key(), &challenge, hello))
}

/// The challenge a listener published in its text handle (`... auth=<32 hex digits>`).
pub fn challenge_in(handle: &[u8]) -> Result<[u8; NONCE_LEN], String> {
    let text = std::str::from_utf8(handle).map_err(|_| "handle is not UTF-8".to_string())?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("auth="))
        .and_then(unhex::<NONCE_LEN>)
        .ok_or_else(|| {
            format!("handle {text:?} carries no auth= challenge (a peer of an older busbw build?)")
        })
}

/// The stateless part of [`DataGate::check`], also the fuzz entry point.
pub fn check_tail(
    key: &Key,
    challenge: &[u8; NONCE_LEN],
    hello: &[u8],
    tail: &[u8],
) -> Result<(), String> {
    if tail.len() != DATA_TAIL_LEN {
        return Err(format!(
            "authentication of {} bytes where {DATA_TAIL_LEN} are expected",
            tail.len()
        ));
    }
    let (nonce, proof) = tail.split_at(NONCE_LEN);
    if !key.verify(label::DATA, &[challenge, hello, nonce], proof) {
        return Err("wrong job token (its proof does not verify)".into());
    }
    Ok(())
}

/// The data-connection handshake as a listener checks it, on arbitrary bytes: the first byte
/// says how much of the rest is the handle text, the remainder is the hello and its tail. The
/// fuzz targets' entry point (`fuzz/`, and its stable twin below): whatever the bytes, this
/// returns, and nothing but a proof made with the key verifies.
#[doc(hidden)]
pub fn fuzz_data_hello(data: &[u8]) -> Result<(), String> {
    let (&n, rest) = data.split_first().ok_or("empty")?;
    let (handle, wire) = rest.split_at((n as usize).min(rest.len()));
    let challenge = challenge_in(handle)?;
    let hello_len = wire.len().saturating_sub(DATA_TAIL_LEN);
    let (hello, tail) = wire.split_at(hello_len);
    let key = Key::from_token(Some("fuzz"));
    check_tail(&key, &challenge, hello, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc4231_case_2() {
        // RFC 4231 test case 2, through the same HMAC the proofs use (no length prefixes).
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(b"Jefe").unwrap();
        m.update(b"what do ya want for nothing?");
        assert_eq!(
            hex(&m.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn proofs_bind_key_label_and_parts() {
        let a = Key::from_token(Some("a"));
        let b = Key::from_token(Some("b"));
        assert_eq!(Key::from_token(None), Key::from_token(Some("")));
        let p = a.proof(label::DATA, &[b"x", b"y"]);
        assert!(a.verify(label::DATA, &[b"x", b"y"], &p));
        assert!(!b.verify(label::DATA, &[b"x", b"y"], &p));
        assert!(!a.verify(label::STORE_CLIENT, &[b"x", b"y"], &p));
        // The length prefixes keep "x"+"y" apart from "xy".
        assert!(!a.verify(label::DATA, &[b"xy"], &p));
        assert!(!a.verify(label::DATA, &[b"x", b"y"], &p[..31]));
        assert_ne!(a.for_job(1), a.for_job(2));
    }

    #[test]
    fn data_gate_accepts_once_and_refuses_strangers_and_replays() {
        let data_key = |job| Identity::new(job, 0).data_key();
        let gate = DataGate::new(&Identity::new(42, 3));
        let hello = [7u8; 32];
        let tail = data_tail(&data_key(42), gate.challenge(), &hello);
        assert_eq!(gate.check(&hello, &tail), Ok(()));
        let replay = gate.check(&hello, &tail).unwrap_err();
        assert!(replay.contains("replayed"), "{replay}");
        // Another job id, another challenge, an altered hello, a short tail: all refused.
        let other = data_tail(&data_key(43), gate.challenge(), &hello);
        assert!(gate.check(&hello, &other).unwrap_err().contains("token"));
        let elsewhere = data_tail(&data_key(42), &[0; NONCE_LEN], &hello);
        assert!(gate.check(&hello, &elsewhere).is_err());
        let fresh = data_tail(&data_key(42), gate.challenge(), &hello);
        assert!(gate.check(&[8u8; 32], &fresh).is_err());
        assert!(gate.check(&hello, &fresh[..40]).is_err());
        // The same job id with another token is a stranger too.
        let token = Identity::new(42, 0).with_token(Some("other")).data_key();
        let stranger = data_tail(&token, gate.challenge(), &hello);
        assert!(gate.check(&hello, &stranger).unwrap_err().contains("token"));
        assert_eq!(gate.check(&hello, &fresh), Ok(()));
        let why = gate
            .admit(
                &data_tail(&data_key(42), gate.challenge(), &hello)[..],
                &[1],
                5,
            )
            .unwrap_err();
        assert!(
            why.starts_with("claims to be rank 5: wrong job token"),
            "{why}"
        );
    }

    /// The stable twin of `fuzz/fuzz_targets/data_hello.rs`: random and mutated inputs.
    #[test]
    fn random_and_mutated_data_hellos_never_verify_or_panic() {
        let handle = format!(
            "busbw-tcp/1 rank=1 addr=127.0.0.1:9{}",
            DataGate::new(&Identity::new(1, 0)).handle_field()
        );
        let mut seed = handle.len() as u8 as u64 | 0x5eed << 8;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut base = vec![handle.len() as u8];
        base.extend_from_slice(handle.as_bytes());
        base.extend_from_slice(&[0u8; 32 + DATA_TAIL_LEN]);
        for i in 0..20_000 {
            let mut d = base.clone();
            match i % 3 {
                0 => d.truncate((next() as usize) % (d.len() + 1)),
                1 => {
                    for _ in 0..1 + next() % 8 {
                        let at = (next() as usize) % d.len();
                        d[at] = next() as u8;
                    }
                }
                _ => d = (0..next() % 200).map(|_| next() as u8).collect(),
            }
            assert!(fuzz_data_hello(&d).is_err(), "input {i} verified: {d:?}");
        }
    }

    #[test]
    fn hex_round_trips_and_rejects_junk() {
        let n = nonce();
        assert_ne!(n, nonce());
        assert_eq!(unhex::<NONCE_LEN>(&hex(&n)), Some(n));
        assert_eq!(unhex::<2>("zz00"), None);
        assert_eq!(unhex::<2>("000"), None);
        assert_eq!(unhex::<2>("é0"), None);
    }
}
