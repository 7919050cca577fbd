//! The link layer: a rank's connections to its peers and how it waits for them. The
//! [`Communicator`] knows peers, channels and nodes, never an algorithm: what the layers
//! above keep per communicator they file with it by type ([`Communicator::kept`]).

mod communicator;
pub mod nodes;
pub mod peers;
mod wait;

pub use communicator::{CommConfig, Communicator, Kept, KEPT_SLOTS, MAX_CHANNELS, SMALL_CHANNEL};
pub(crate) use wait::Waiter;
