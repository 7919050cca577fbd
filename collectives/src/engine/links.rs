//! The connections a call borrows from its communicator, handed back when it ends, whichever
//! way it ends.

use super::{Dir, Link};
use crate::communicator::Communicator;
use crate::error::CommError;
use busbw_transports::{RecvComm, SendComm, Sleep};

pub(crate) enum Conn {
    Send(Box<dyn SendComm>),
    Recv(Box<dyn RecvComm>),
}

/// A taken connection: peer, channel, the connection. Indexed like the plan's links.
pub(crate) type Taken = Vec<Option<(usize, u32, Conn)>>;

/// A communicator with some of its connections taken out for a call.
pub(crate) struct Conns<'c, 't> {
    pub comm: &'c mut Communicator,
    /// `None` until taken; empty again once handed back (the executor reuses the vector).
    taken: &'t mut Taken,
}

impl<'c, 't> Conns<'c, 't> {
    /// Take every link's connection, all sends before any receive (see [`Link`]).
    pub fn take(
        comm: &'c mut Communicator,
        links: &[Link],
        taken: &'t mut Taken,
    ) -> Result<Self, CommError> {
        taken.clear();
        taken.resize_with(links.len(), || None);
        let c = Conns { comm, taken };
        for dir in [Dir::Send, Dir::Recv] {
            for (i, l) in links.iter().enumerate().filter(|(_, l)| l.dir == dir) {
                let conn = match dir {
                    Dir::Send => Conn::Send(c.comm.take_send(l.peer, l.channel)?),
                    Dir::Recv => Conn::Recv(c.comm.take_recv(l.peer, l.channel)?),
                };
                c.taken[i] = Some((l.peer, l.channel, conn));
            }
        }
        Ok(c)
    }

    pub fn send(&mut self, link: usize) -> &mut (dyn SendComm + 'static) {
        match &mut self.taken[link] {
            Some((_, _, Conn::Send(s))) => s.as_mut(),
            _ => panic!("link {link} is not a taken send connection"),
        }
    }

    pub fn recv(&mut self, link: usize) -> &mut (dyn RecvComm + 'static) {
        match &mut self.taken[link] {
            Some((_, _, Conn::Recv(r))) => r.as_mut(),
            _ => panic!("link {link} is not a taken receive connection"),
        }
    }

    /// What `link`'s connection would wait on.
    pub fn sleep_on(&mut self, link: usize) -> Sleep {
        match &mut self.taken[link] {
            Some((_, _, Conn::Send(s))) => s.sleep_on(),
            Some((_, _, Conn::Recv(r))) => r.sleep_on(),
            None => Sleep::Nap,
        }
    }

    /// The sleep prepared by [`Conns::sleep_on`] is over.
    pub fn woke(&mut self, link: usize) {
        match &mut self.taken[link] {
            Some((_, _, Conn::Send(s))) => s.woke(),
            Some((_, _, Conn::Recv(r))) => r.woke(),
            None => {}
        }
    }
}

impl Drop for Conns<'_, '_> {
    fn drop(&mut self) {
        for (peer, channel, conn) in self.taken.drain(..).flatten() {
            match conn {
                Conn::Send(s) => self.comm.put_send(peer, channel, s),
                Conn::Recv(r) => self.comm.put_recv(peer, channel, r),
            }
        }
    }
}
