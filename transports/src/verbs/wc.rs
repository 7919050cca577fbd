//! Work-completion statuses in words, with what to check. The numbers are `ibv_wc_status`
//! (stable verbs ABI), so this compiles and is tested without libibverbs.

/// `IBV_WC_SUCCESS`.
pub const SUCCESS: u32 = 0;
/// `IBV_WC_WR_FLUSH_ERR`: a consequence of an earlier error, never the cause.
pub const WR_FLUSH_ERR: u32 = 5;
/// `IBV_WC_RETRY_EXC_ERR`.
pub const RETRY_EXC_ERR: u32 = 12;
/// `IBV_WC_RNR_RETRY_EXC_ERR`.
pub const RNR_RETRY_EXC_ERR: u32 = 13;

/// The `ibv_wc_status` name of `status`.
pub fn name(status: u32) -> &'static str {
    match status {
        0 => "IBV_WC_SUCCESS",
        1 => "IBV_WC_LOC_LEN_ERR",
        2 => "IBV_WC_LOC_QP_OP_ERR",
        3 => "IBV_WC_LOC_EEC_OP_ERR",
        4 => "IBV_WC_LOC_PROT_ERR",
        5 => "IBV_WC_WR_FLUSH_ERR",
        6 => "IBV_WC_MW_BIND_ERR",
        7 => "IBV_WC_BAD_RESP_ERR",
        8 => "IBV_WC_LOC_ACCESS_ERR",
        9 => "IBV_WC_REM_INV_REQ_ERR",
        10 => "IBV_WC_REM_ACCESS_ERR",
        11 => "IBV_WC_REM_OP_ERR",
        12 => "IBV_WC_RETRY_EXC_ERR",
        13 => "IBV_WC_RNR_RETRY_EXC_ERR",
        14 => "IBV_WC_LOC_RDD_VIOL_ERR",
        15 => "IBV_WC_REM_INV_RD_REQ_ERR",
        16 => "IBV_WC_REM_ABORT_ERR",
        17 => "IBV_WC_INV_EECN_ERR",
        18 => "IBV_WC_INV_EEC_STATE_ERR",
        19 => "IBV_WC_FATAL_ERR",
        20 => "IBV_WC_RESP_TIMEOUT_ERR",
        21 => "IBV_WC_GENERAL_ERR",
        _ => "unknown status",
    }
}

/// What a failed completion means and what to look at. `first` says no work request on the
/// connection had completed yet: a retry-exhausted error then means packets never reached the
/// peer (NCCL issues 426 and 769), not that the peer died mid-run.
pub fn explain(status: u32, vendor_err: u32, first: bool) -> String {
    let hint = match status {
        RETRY_EXC_ERR if first => {
            "peer unreachable or wrong GID: the first transfer got no acknowledgement. Check that \
             both ports are on the same routable network, that the chosen GIDs are RoCE v2 with \
             an IPv4 address (`busbw doctor`; NCCL_IB_GID_INDEX / NCCL_IB_ADDR_FAMILY / \
             NCCL_IB_ADDR_RANGE), and the switch's lossless/PFC and MTU settings"
        }
        RETRY_EXC_ERR => {
            "the peer stopped acknowledging (its process or port went away, or the link \
             dropped); raise NCCL_IB_TIMEOUT / NCCL_IB_RETRY_CNT only for congested fabrics"
        }
        RNR_RETRY_EXC_ERR => {
            "the peer had no receive posted (a protocol bug in busbw: please report)"
        }
        4 | 8 | 10 => "memory protection: a buffer was not registered or was freed while in use",
        1 => "length error: the ranks disagree about message sizes",
        9 | 11 => {
            "the peer's queue pair rejected the operation (remote access flags, or it is in error)"
        }
        WR_FLUSH_ERR => "flushed after an earlier error on the same queue pair",
        2 => {
            "this host could not send: its RDMA port or link may be down, or the GID's address \
             was removed (check `rdma link` and `ip link` here)"
        }
        19 => "fatal device error: check `dmesg` and the NIC's firmware",
        _ => "see the NIC's documentation for the vendor syndrome",
    };
    format!(
        "{} (status {status}, vendor syndrome {vendor_err:#x}): {hint}",
        name(status)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_exceeded_right_after_connect_names_the_gid() {
        let m = explain(RETRY_EXC_ERR, 0x81, true);
        assert!(
            m.contains("IBV_WC_RETRY_EXC_ERR") && m.contains("peer unreachable or wrong GID"),
            "{m}"
        );
        let later = explain(RETRY_EXC_ERR, 0x81, false);
        assert!(
            !later.contains("wrong GID") && later.contains("stopped acknowledging"),
            "{later}"
        );
        assert!(explain(10, 0, false).contains("IBV_WC_REM_ACCESS_ERR"));
        assert_eq!(name(99), "unknown status");
    }
}
