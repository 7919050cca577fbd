//! Where a communicator learns its peers' connection handles.
//!
//! A handle is needed only when a connection to the peer is opened, and a rank of a ring or
//! tree opens a handful: asking for all of them up front makes every rank fetch every
//! rank's handle, which at 32768 ranks is a billion fetched records across the job. So the
//! communicator asks a [`PeerBook`] for one peer's handle the first time it connects to that
//! peer; the book may hold them all (a list exchanged beforehand, what tests and
//! sub-communicators use) or fetch them on demand from the rendezvous store (the job's).

use busbw_transports::Handle;

pub use crate::error::LookupError;

/// Every peer's connection handle, looked up when first needed.
pub trait PeerBook: Send {
    /// Ranks in the communicator, this one included.
    fn size(&self) -> usize;

    /// Rank `rank`'s listen handle. Books that fetch keep what they fetched: the
    /// communicator asks again for each channel it opens to the peer.
    fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError>;
}

/// Every handle known up front, in rank order.
impl PeerBook for Vec<Handle> {
    fn size(&self) -> usize {
        self.len()
    }

    fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError> {
        let n = self.len();
        self.get(rank)
            .ok_or_else(|| format!("no rank {rank} in a communicator of {n}").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A book that cannot say how to reach rank 2.
    struct Partial(Vec<Handle>);

    impl PeerBook for Partial {
        fn size(&self) -> usize {
            3
        }

        fn handle(&mut self, rank: usize) -> Result<&Handle, LookupError> {
            match rank {
                2 => Err("rank 2 never registered".into()),
                r => self.0.handle(r),
            }
        }
    }

    #[test]
    fn a_handle_that_cannot_be_had_names_the_peer() {
        use busbw_transports::inproc::InprocTransport;
        use busbw_transports::{Identity, Transport};
        let t = InprocTransport::new(Identity::new(9, 0));
        let (h, l) = t.listen().unwrap();
        let book = Partial(vec![h.clone(), h]);
        let config = crate::CommConfig::default();
        let mut comm = crate::Communicator::new(Box::new(t), l, book, config).unwrap();
        let e = comm.connect_send(2, 0).unwrap_err();
        assert_eq!(e.peer(), Some(2));
        assert_eq!(e.to_string(), "rank 0: looking up how to reach rank 2");
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("rank 2 never registered"));
    }

    #[test]
    fn a_list_is_a_book() {
        let mut book = vec![Handle(b"a".to_vec()), Handle(b"b".to_vec())];
        assert_eq!(PeerBook::size(&book), 2);
        assert_eq!(book.handle(1).unwrap(), &Handle(b"b".to_vec()));
        let e = book.handle(2).unwrap_err().to_string();
        assert_eq!(e, "no rank 2 in a communicator of 2");
    }
}
