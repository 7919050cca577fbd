//! The 16-byte header every stream transport puts before a message: magic, tag, length.
//!
//! One definition for TCP and shared memory, so that both report a desynchronised stream, a
//! tag from another collective call and an oversized message the same way.

use crate::{Result, TransportError};

pub(crate) const HEADER_LEN: usize = 16;

/// The header of a `len`-byte message carrying `tag`.
pub(crate) fn encode(magic: u32, tag: u32, len: usize) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&magic.to_le_bytes());
    h[4..8].copy_from_slice(&tag.to_le_bytes());
    h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    h
}

/// Checks a received header against the receive posted for it and returns the message
/// length. `stream` names the transport in the corrupt-stream message.
pub(crate) fn check(
    h: &[u8; HEADER_LEN],
    magic: u32,
    stream: &str,
    peer: u32,
    posted_tag: u32,
    posted_len: usize,
) -> Result<usize> {
    let word = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let mut l = [0u8; 8];
    l.copy_from_slice(&h[8..16]);
    let len = u64::from_le_bytes(l);
    if word(0) != magic {
        return Err(TransportError::Handshake(format!(
            "corrupt {stream} stream from rank {peer}: bad message magic {:#x}",
            word(0)
        )));
    }
    if word(4) != posted_tag {
        return Err(TransportError::TagMismatch {
            peer,
            expected: posted_tag,
            got: word(4),
        });
    }
    if len > posted_len as u64 {
        return Err(TransportError::Truncated {
            peer,
            sent: len,
            posted: posted_len,
        });
    }
    Ok(len as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_mismatch() {
        let h = encode(7, 3, 100);
        assert_eq!(check(&h, 7, "tcp", 1, 3, 100).unwrap(), 100);
        assert!(matches!(
            check(&h, 8, "tcp", 1, 3, 100),
            Err(TransportError::Handshake(m)) if m.contains("rank 1")
        ));
        assert!(matches!(
            check(&h, 7, "tcp", 1, 4, 100),
            Err(TransportError::TagMismatch {
                peer: 1,
                expected: 4,
                got: 3
            })
        ));
        assert!(matches!(
            check(&h, 7, "tcp", 1, 3, 99),
            Err(TransportError::Truncated {
                peer: 1,
                sent: 100,
                posted: 99
            })
        ));
    }
}
