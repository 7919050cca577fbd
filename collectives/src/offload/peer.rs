//! What devices of one host tell each other so that one can read and write the other's
//! memory in place (CUDA IPC, or peer access between devices of one process): who a device
//! is ([`PeerId`]) and a device range exported for peers ([`PeerHandle`]). Both are fixed
//! words, so that ranks trade them in one small all-to-all exchange like any other
//! description; only the device kind that made them reads their contents.

/// Who a device is, for a peer deciding whether it can reach it: words the device kind
/// defines (the CUDA offload: a tag, the process, the PCI bus id, the ordinal; the
/// simulated device: a tag, its island and number).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PeerId(pub [u64; 4]);

/// A device range exported for peers: `key` names the allocation (the CUDA IPC handle's 64
/// bytes plus the owner's process and base pointer; the simulated device's allocation id),
/// `offset` and `len` the range inside it. A peer opens it with
/// [`Offload::open_peer`](super::Offload::open_peer); two handles with one key are one
/// mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PeerHandle {
    pub key: [u64; 10],
    pub offset: u64,
    pub len: u64,
}

impl PeerHandle {
    /// Words of a handle in a description.
    pub const WORDS: usize = 12;

    pub fn to_words(&self) -> [u64; Self::WORDS] {
        let mut w = [0u64; Self::WORDS];
        w[..10].copy_from_slice(&self.key);
        (w[10], w[11]) = (self.offset, self.len);
        w
    }

    pub fn from_words(w: &[u64]) -> PeerHandle {
        let mut key = [0u64; 10];
        key.copy_from_slice(&w[..10]);
        PeerHandle {
            key,
            offset: w[10],
            len: w[11],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_words() {
        let h = PeerHandle {
            key: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
            offset: 4096,
            len: 77,
        };
        assert_eq!(PeerHandle::from_words(&h.to_words()), h);
    }
}
