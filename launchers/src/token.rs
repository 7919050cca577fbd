//! The job token: what keeps one job's ranks from joining another job's rendezvous.
//!
//! With `hostNetwork` pods, or several jobs sharing a host, two jobs can be given the same
//! store port; without a token a rank of job B that reaches job A's store would be counted as
//! one of A's ranks and both jobs would fail in confusing ways. Every store and data
//! connection proves the token by a challenge-response ([`busbw_transports::auth`]); the token
//! itself never goes on the wire, so a token that is also used elsewhere is not leaked by
//! busbw, and nothing recorded off the wire can be replayed to get in.
//!
//! The digest below is a keyless 64-bit hash that salts the data plane's job id, so that two
//! jobs with different tokens never share one even if their random halves collided.

/// Environment variable through which the launchers hand the token to the ranks they start.
pub const JOB_TOKEN_ENV: &str = "BUSBW_JOB_TOKEN";

/// Keeps busbw's digests apart from any other use of the same hash over the same string.
const DOMAIN: u64 = 0x6275_7362_772d_746b; // "busbw-tk"

/// The token's digest, which salts the data path's job id. Never 0, which means "no token".
pub fn token_digest(token: &str) -> u64 {
    let bytes = token.as_bytes();
    let mut h = mix(DOMAIN ^ (bytes.len() as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        // Each word passes through a full avalanche round, so no two inputs of the same
        // length differ by a cancelling pattern of words.
        h = mix(h ^ u64::from_le_bytes(w)).wrapping_add(0x632b_e59b_d9b4_e019);
    }
    match mix(h) {
        0 => 1,
        d => d,
    }
}

/// SplitMix64's finalizer: every input bit affects every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn digests_are_stable_distinct_and_nonzero() {
        assert_eq!(token_digest("job-a"), token_digest("job-a"));
        assert_ne!(token_digest("job-a"), token_digest("job-b"));
        // Lengths and trailing zero bytes matter: the zero-padded last word must not collide.
        assert_ne!(token_digest("a"), token_digest("a\0"));
        assert_ne!(token_digest(""), token_digest("\0"));
        let mut seen = HashSet::new();
        for i in 0..20_000u32 {
            let d = token_digest(&format!("token-{i}"));
            assert_ne!(d, 0);
            assert!(seen.insert(d), "collision at {i}");
        }
        // One flipped input bit flips about half of the output bits.
        let flips: u32 = (0..64u32)
            .map(|i| {
                let a = token_digest(&format!("{i:08}"));
                let b = token_digest(&format!("{:08}", i ^ 1));
                (a ^ b).count_ones()
            })
            .sum();
        let avg = flips as f64 / 64.0;
        assert!((24.0..40.0).contains(&avg), "{avg}");
    }
}
