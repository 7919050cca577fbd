//! `busbw k8s`: prints what `busbw_k8s` renders.

use crate::exit;
pub use busbw_k8s::{K8sArgs, K8sCommand};
use std::io::Write;

pub fn main(a: &K8sArgs, argv: &[String]) -> i32 {
    match &a.command {
        K8sCommand::Render(r) => match busbw_k8s::render(r, argv) {
            Ok(text) => match std::io::stdout().lock().write_all(text.as_bytes()) {
                Ok(()) => exit::OK,
                Err(e) => {
                    eprintln!("busbw: error: writing the manifests: {e}");
                    exit::INTERNAL
                }
            },
            Err(msg) => {
                eprintln!("busbw: error: {msg}");
                exit::USAGE
            }
        },
    }
}
