//! `busbw doctor`: the RDMA report of `busbw_transports::verbs::doctor` for this host.

use crate::cli::DoctorArgs;
use busbw_transports::verbs::{doctor, hca::HcaFilter, library_status, sysfs::Sysfs, VerbsConfig};

pub fn main(args: &DoctorArgs) -> i32 {
    let env = |k: &str| std::env::var(k).ok().filter(|_| k != "NCCL_IB_HCA");
    let mut cfg = match VerbsConfig::from_env(env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("busbw doctor: error: {e}");
            return crate::exit::USAGE;
        }
    };
    if let Some(spec) = &args.ib_hca {
        match HcaFilter::parse(spec) {
            Ok(f) => cfg.hca = f,
            Err(e) => {
                eprintln!("busbw doctor: error: --ib-hca / NCCL_IB_HCA: {e}");
                return crate::exit::USAGE;
            }
        }
    }
    cfg.sysfs = Sysfs::new(&args.sysfs_root);
    cfg.local_rank = args.local_rank;
    let r = doctor::report(&cfg, library_status());
    print!("{}", r.text);
    if r.usable {
        0
    } else {
        1
    }
}
