//! The peers' shared regions mapped here, kept per communicator by the direct AllReduce
//! (this process's own regions are `crate::buffer::shared`'s).

pub(crate) use crate::buffer::shared::{key_of, map_file, Key, Mapping};
use std::io;

/// A peer's region kept mapped by [`Windows`].
struct Mapped {
    rank: usize,
    ino: u64,
    dev: u64,
    map: Mapping,
    /// Call counter of its last use, for eviction.
    used: u64,
}

/// Peers' regions kept mapped by one communicator between calls: a sweep's buffers are
/// mapped once, on its first call.
#[derive(Default)]
pub(crate) struct Windows {
    maps: Vec<Mapped>,
    calls: u64,
}

/// Mappings kept per peer: a sweep uses two (send and receive buffers) and a calibration one
/// more; older ones are unmapped when newer ones come.
const KEEP_PER_PEER: usize = 4;

impl Windows {
    /// Starts a call: mappings used from now on are this call's.
    pub fn begin(&mut self) {
        self.calls += 1;
    }

    /// The address in this process of `len` bytes at `key` in `rank`'s memory, mapping the
    /// peer's file if it is not mapped yet.
    pub fn map(&mut self, rank: usize, key: &Key, len: u64) -> io::Result<*mut u8> {
        key.off
            .checked_add(len)
            .filter(|&e| e <= key.region.len)
            .ok_or_else(|| invalid("the range lies outside the peer's buffer"))?;
        let calls = self.calls;
        if let Some(m) = self
            .maps
            .iter_mut()
            .find(|m| m.rank == rank && m.ino == key.region.ino && m.dev == key.region.dev)
        {
            if m.map.len() as u64 == key.region.len {
                m.used = calls;
                // off + len <= file_len == the mapping's length (checked above).
                return Ok(m.map.at(key.off as usize));
            }
        }
        // A stale mapping of the same file (it cannot change size, but be safe) goes first.
        self.maps
            .retain(|m| !(m.rank == rank && m.ino == key.region.ino && m.dev == key.region.dev));
        let m = Mapped {
            rank,
            ino: key.region.ino,
            dev: key.region.dev,
            map: map_file(key)?,
            used: calls,
        };
        let p = m.map.at(key.off as usize);
        self.maps.push(m);
        let mine = self.maps.iter().filter(|m| m.rank == rank).count();
        if mine > KEEP_PER_PEER {
            // Oldest first; never one used in this call.
            if let Some(i) = self
                .maps
                .iter()
                .enumerate()
                .filter(|(_, m)| m.rank == rank && m.used < calls)
                .min_by_key(|(_, m)| m.used)
                .map(|(i, _)| i)
            {
                self.maps.swap_remove(i);
            }
        }
        Ok(p)
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostBuffer;
    use busbw_transports::platform::{PeerKey, Platform};

    #[test]
    fn a_mapping_sees_the_same_memory_and_a_wrong_key_is_refused() {
        for &p in Platform::ALL {
            a_mapping_sees_the_same_memory_on(p);
        }
    }

    fn a_mapping_sees_the_same_memory_on(platform: Platform) {
        let mut b = HostBuffer::shared_on(platform, 3 * 4096).unwrap();
        assert_eq!(b.sharing(), Some(platform));
        let at = b.as_slice().as_ptr().wrapping_add(4096 + 8);
        let key = key_of(at, 100).expect("inside a shared buffer");
        assert_eq!((key.off, key.region.len), (4096 + 8, 3 * 4096));
        assert_eq!(key.region.is_named(), platform == Platform::Portable);
        assert_eq!(Key::from_words(&key.to_words()), key);
        assert!(key_of(at, 3 * 4096).is_none(), "runs past the end");
        let mut w = Windows::default();
        w.begin();
        let p = w.map(1, &key, 100).unwrap();
        b.as_mut_slice()[4096 + 8] = 0xa5;
        // SAFETY: the mapping holds 100 bytes from p.
        assert_eq!(unsafe { p.read_volatile() }, 0xa5);
        // SAFETY: as above.
        unsafe { p.add(1).write_volatile(0x5a) };
        assert_eq!(b.as_slice()[4096 + 9], 0x5a);
        // The same file again: the same mapping.
        assert_eq!(w.map(1, &key, 100).unwrap(), p);
        let wrong = Key {
            region: PeerKey {
                ino: key.region.ino ^ 1,
                ..key.region
            },
            ..key
        };
        let e = w.map(2, &wrong, 100).unwrap_err().to_string();
        assert!(e.contains("not the buffer it described"), "{e}");
        assert!(w.map(2, &key, 3 * 4096).is_err(), "a range beyond the file");
        drop(w);
        drop(b);
        assert!(key_of(at, 1).is_none(), "forgotten when freed");
    }

    #[test]
    fn heap_buffers_have_no_key() {
        let b = HostBuffer::mapped(8192).unwrap();
        assert!(!b.is_shared());
        assert!(key_of(b.as_slice().as_ptr(), 10).is_none());
    }
}
