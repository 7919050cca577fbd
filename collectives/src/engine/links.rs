//! The connections a call uses, borrowed in place from its communicator: nothing is taken
//! out, so nothing has to be handed back, whichever way the call ends.

use super::{Dir, Link};
use crate::error::CommError;
use crate::link::Communicator;
use busbw_transports::{RecvComm, SendComm, Sleep};

/// A communicator whose connections for a schedule's links are open.
pub(crate) struct Conns<'c, 'l> {
    pub comm: &'c mut Communicator,
    links: &'l [Link],
}

impl<'c, 'l> Conns<'c, 'l> {
    /// Open every link's connection that is not open yet, all sends before any receive (see
    /// [`Link`]).
    pub fn open(comm: &'c mut Communicator, links: &'l [Link]) -> Result<Self, CommError> {
        for dir in [Dir::Send, Dir::Recv] {
            for l in links.iter().filter(|l| l.dir == dir) {
                match dir {
                    Dir::Send => comm.connect_send(l.peer, l.channel)?,
                    Dir::Recv => comm.accept_recv(l.peer, l.channel)?,
                }
            }
        }
        Ok(Conns { comm, links })
    }

    pub fn send(&mut self, link: usize) -> &mut (dyn SendComm + 'static) {
        let l = &self.links[link];
        match self.comm.send_to(l.peer, l.channel) {
            Some(s) => s,
            None => panic!("link {link} has no open send connection"),
        }
    }

    pub fn recv(&mut self, link: usize) -> &mut (dyn RecvComm + 'static) {
        let l = &self.links[link];
        match self.comm.recv_from(l.peer, l.channel) {
            Some(r) => r,
            None => panic!("link {link} has no open receive connection"),
        }
    }

    /// What `link`'s connection would wait on.
    pub fn sleep_on(&mut self, link: usize) -> Sleep {
        match self.links[link].dir {
            Dir::Send => self.send(link).sleep_on(),
            Dir::Recv => self.recv(link).sleep_on(),
        }
    }

    /// The sleep prepared by [`Conns::sleep_on`] is over.
    pub fn woke(&mut self, link: usize) {
        match self.links[link].dir {
            Dir::Send => self.send(link).woke(),
            Dir::Recv => self.recv(link).woke(),
        }
    }
}
