//! The receiving half both byte-stream transports share. tcp and shm carry the same stream
//! (a [`crate::frame`] header, then the payload) and keep the same queue of posted receives;
//! they differ only in how bytes arrive (a socket, a ring in shared memory) and how a side
//! with nothing to do sleeps, which is what each supplies as an [`Inbound`].

use crate::slots::Slots;
use crate::{RecvComm, Registration, RequestId, Result, Sleep};

/// A posted receive: where the next message goes, at most how long it may be, and its tag.
pub(crate) struct RecvReq {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) tag: u32,
}

// SAFETY: the pointer is only dereferenced by the comm's owner thread while the request is in
// flight; `irecv`'s contract keeps the memory valid until then.
unsafe impl Send for RecvReq {}

/// The queue of posted receives, oldest first: the front is the one the next message fills.
pub(crate) type Posted = Slots<RecvReq>;

/// How bytes reach a byte-stream connection's receiver.
pub(crate) trait Inbound: Send {
    /// Moves what has arrived into the posted receives, checking each message's header
    /// against its receive, and completes those whose message is whole.
    fn progress(&mut self, posted: &mut Posted) -> Result<()>;

    /// As [`RecvComm::readiness_fd`].
    fn readiness_fd(&self) -> Option<i32> {
        None
    }

    /// As [`RecvComm::sleep_on`]; `posted` says whether anything is awaited at all.
    fn sleep_on(&mut self, posted: &Posted) -> Sleep;

    /// As [`RecvComm::woke`].
    fn woke(&mut self) {}

    /// As [`RecvComm::take_reverse`].
    fn take_reverse(&mut self) -> Option<Box<dyn crate::SendComm>> {
        None
    }
}

/// A [`RecvComm`] over an [`Inbound`].
pub(crate) struct FramedRecv<I> {
    posted: Posted,
    peer: u32,
    channel: u32,
    inbound: I,
}

impl<I: Inbound> FramedRecv<I> {
    pub(crate) fn new(inbound: I, peer: u32, channel: u32, max_requests: usize) -> Self {
        FramedRecv {
            posted: Slots::new(max_requests, peer),
            peer,
            channel,
            inbound,
        }
    }
}

impl<I: Inbound> RecvComm for FramedRecv<I> {
    unsafe fn irecv(
        &mut self,
        registration: &Registration,
        ptr: *mut u8,
        len: usize,
        tag: u32,
    ) -> Result<RequestId> {
        registration.check(ptr, len)?;
        self.posted.post(RecvReq { ptr, len, tag })
    }

    fn test(&mut self, request: RequestId) -> Result<Option<usize>> {
        self.inbound.progress(&mut self.posted)?;
        self.posted.take(request)
    }

    fn peer(&self) -> u32 {
        self.peer
    }

    fn channel(&self) -> u32 {
        self.channel
    }

    fn readiness_fd(&self) -> Option<i32> {
        self.inbound.readiness_fd()
    }

    fn sleep_on(&mut self) -> Sleep {
        self.inbound.sleep_on(&self.posted)
    }

    fn woke(&mut self) {
        self.inbound.woke()
    }

    fn take_reverse(&mut self) -> Option<Box<dyn crate::SendComm>> {
        self.inbound.take_reverse()
    }
}
