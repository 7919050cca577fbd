use super::testing::*;
use super::*;

const HOSTS4: &str = "job-rank-0.job\njob-rank-1.job\njob-rank-2.job\njob-rank-3.job\n";

fn with_host(launcher: Launcher, host: &str, dir: &TempDir) -> DetectOptions {
    DetectOptions {
        hostname: host.into(),
        volcano_dir: dir.0.clone(),
        ..opts(launcher)
    }
}

#[test]
fn launcher_names_round_trip() {
    for l in Launcher::ALL {
        assert_eq!(l.name().parse::<Launcher>().unwrap(), l);
        assert_eq!(l.to_string(), l.name());
    }
    for (s, l) in [
        ("torchrun", Launcher::Env),
        ("Kubernetes", Launcher::K8s),
        ("jobset", Launcher::K8s),
        (" SLURM ", Launcher::Slurm),
    ] {
        assert_eq!(s.parse::<Launcher>().unwrap(), l);
    }
    let e = "pbs".parse::<Launcher>().unwrap_err();
    assert!(
        e.to_string().contains("\"pbs\"") && e.to_string().contains("volcano"),
        "{e}"
    );
}

#[test]
fn nothing_set_means_local() {
    assert_eq!(run(&opts(Launcher::Auto), &[]).unwrap(), None);
    // --launcher local ignores whatever is set.
    assert_eq!(
        run(
            &opts(Launcher::Local),
            &[("RANK", "1"), ("WORLD_SIZE", "2")]
        )
        .unwrap(),
        None
    );
    // Templated-but-empty variables are unset.
    assert_eq!(
        run(
            &opts(Launcher::Auto),
            &[("RANK", ""), ("VC_TASK_INDEX", " ")]
        )
        .unwrap(),
        None
    );
}

#[test]
fn torchrun_variables() {
    let vars = [
        ("RANK", "5"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "node-0"),
        ("MASTER_PORT", "1234"),
    ];
    let d = found(&opts(Launcher::Auto), &vars);
    assert_eq!(d.source, Launcher::Env);
    assert!(!d.launched);
    assert_eq!(pos(&d), (5, 8, 1, 4));
    assert_eq!(d.world.store_addr().unwrap(), "node-0:1234");
    assert_eq!(d.world.hostname, "test-host");
    assert!(
        d.notes.iter().any(|n| n.contains("MASTER_ADDR")),
        "{:?}",
        d.notes
    );

    // No MASTER_PORT: --port, else torchrun's default.
    let d = found(&opts(Launcher::Env), &vars[..5]);
    assert_eq!(d.world.master_port, 29500);
    assert!(
        d.notes.iter().any(|n| n.contains("29500 (default")),
        "{:?}",
        d.notes
    );
    let o = DetectOptions {
        port: Some(4000),
        master_addr: Some("explicit".into()),
        ..opts(Launcher::Env)
    };
    let d = found(&o, &vars[..5]);
    assert_eq!(d.world.store_addr().unwrap(), "explicit:4000");
    // MASTER_PORT beats --port.
    assert_eq!(found(&o, &vars).world.master_port, 1234);

    // A single rank needs no address.
    let d = found(&opts(Launcher::Auto), &[("RANK", "0"), ("WORLD_SIZE", "1")]);
    assert_eq!(d.world.store_addr(), None);

    let e = failed(&opts(Launcher::Auto), &[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("MASTER_ADDR"), "{e}");
    let e = failed(&opts(Launcher::Auto), &[("RANK", "x"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("RANK=\"x\""), "{e}");
    let e = failed(
        &opts(Launcher::Auto),
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "0"),
        ],
    );
    assert!(e.contains("MASTER_PORT=\"0\""), "{e}");
    let o = DetectOptions {
        port: Some(0),
        ..opts(Launcher::Auto)
    };
    let e = failed(
        &o,
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
    );
    assert!(e.contains("--port=\"0\""), "{e}");
}

#[test]
fn forced_launchers_name_what_is_missing() {
    for (l, var) in [
        (Launcher::Env, "RANK"),
        (Launcher::Volcano, "VC_TASK_INDEX"),
        (Launcher::Slurm, "SLURM_PROCID"),
        (Launcher::Mpi, "OMPI_COMM_WORLD_RANK"),
        (Launcher::K8s, "JOB_COMPLETION_INDEX"),
    ] {
        // Another launcher's variables do not stand in for the requested one's.
        let e = failed(
            &opts(l),
            &[("JOB_COMPLETION_INDEX_X", "1"), ("PMIX_RANK", "0")],
        );
        assert!(e.starts_with(&format!("{var} ")), "{l}: {e}");
        assert!(e.contains(&format!("--launcher {l}")), "{l}: {e}");
    }
    let e = failed(&opts(Launcher::Slurm), &[("SLURM_PROCID", "0")]);
    assert!(e.contains("SLURM_NTASKS") && e.contains("srun"), "{e}");
}

#[test]
fn children_of_a_busbw_launcher_read_torchrun_variables_only() {
    let vars = [
        ("BUSBW_LAUNCHED", "1"),
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
        ("LOCAL_WORLD_SIZE", "4"),
        ("MASTER_ADDR", "n0"),
        ("MASTER_PORT", "29400"),
        // Inherited from the pod-level launch:
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
    ];
    for l in [Launcher::Auto, Launcher::Slurm, Launcher::Mpi] {
        let d = found(&opts(l), &vars);
        assert_eq!((d.source, d.launched), (Launcher::Env, true));
        assert_eq!(pos(&d), (3, 8, 3, 4));
    }
    let e = failed(
        &opts(Launcher::Auto),
        &[("BUSBW_LAUNCHED", "1"), ("SLURM_PROCID", "0")],
    );
    assert!(e.contains("RANK") && e.contains("BUSBW_LAUNCHED=1"), "{e}");
    assert!(launched_by_busbw(&env(&[("BUSBW_LAUNCHED", "1")])));
    assert!(!launched_by_busbw(&env(&[("BUSBW_LAUNCHED", "0")])));
}

#[test]
fn volcano_from_files() {
    let dir = TempDir::new("vc-files");
    dir.write("rank.host", HOSTS4);
    // The svc plugin also writes these; they must not confuse the task list.
    dir.write("VC_RANK_HOSTS", &HOSTS4.trim().replace('\n', ","));
    dir.write("VC_RANK_NUM", "4");
    let o = with_host(Launcher::Auto, "job-rank-2", &dir);
    let d = found(&o, &[("VC_TASK_INDEX", "2")]);
    assert_eq!(d.source, Launcher::Volcano);
    assert_eq!(pos(&d), (2, 4, 0, 1));
    assert_eq!(d.world.store_addr().unwrap(), "job-rank-0.job:29500");
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("first host of task rank")),
        "{:?}",
        d.notes
    );

    // MASTER_PORT wins over --port; the legacy index variable works too.
    let o2 = DetectOptions {
        port: Some(7000),
        ..o.clone()
    };
    assert_eq!(
        found(&o2, &[("VK_TASK_INDEX", "1")]).world.master_port,
        7000
    );
    let d = found(&o2, &[("VC_TASK_INDEX", "1"), ("MASTER_PORT", "7100")]);
    assert_eq!((d.world.rank, d.world.master_port), (1, 7100));

    // hostNetwork: the host name is the node's, and the only task is ours anyway.
    let o3 = with_host(Launcher::Volcano, "gpu-node-17.cluster", &dir);
    let d = found(&o3, &[("VC_TASK_INDEX", "3")]);
    assert_eq!(pos(&d), (3, 4, 0, 1));
    assert!(
        d.notes.iter().any(|n| n.contains("only task")),
        "{:?}",
        d.notes
    );

    let e = failed(&o, &[("VC_TASK_INDEX", "4")]);
    assert!(
        e.contains("VC_TASK_INDEX=\"4\"") && e.contains("4 pod(s)"),
        "{e}"
    );
    let e = failed(&o, &[("VC_TASK_INDEX", "two")]);
    assert!(e.contains("VC_TASK_INDEX=\"two\""), "{e}");
}

#[test]
fn volcano_from_variables_alone() {
    let dir = TempDir::new("vc-env"); // empty: ConfigMap not mounted
    let o = with_host(Launcher::Auto, "ccl-preflight-rank-1", &dir);
    let vars = [
        ("VC_TASK_INDEX", "1"),
        (
            "VC_RANK_HOSTS",
            "ccl-preflight-rank-0.ccl-preflight,ccl-preflight-rank-1.ccl-preflight",
        ),
        ("VC_RANK_NUM", "2"),
    ];
    let d = found(&o, &vars);
    assert_eq!(pos(&d), (1, 2, 0, 1));
    assert_eq!(d.world.master_addr, "ccl-preflight-rank-0.ccl-preflight");

    // Only a count: the position is known, rank 0's host is not.
    let e = failed(&o, &[vars[0], vars[2]]);
    assert!(e.contains("MASTER_ADDR") && e.contains("task rank"), "{e}");
    let d = found(&o, &[vars[0], vars[2], ("MASTER_ADDR", "r0")]);
    assert_eq!(d.world.master_addr, "r0");

    let e = failed(&o, &[vars[0], vars[1], ("VC_RANK_NUM", "3")]);
    assert!(
        e.contains("VC_RANK_NUM=\"3\"") && e.contains("2 host(s)"),
        "{e}"
    );
    let e = failed(&o, &[vars[0], vars[1], ("VC_RANK_NUM", "lots")]);
    assert!(e.contains("VC_RANK_NUM=\"lots\""), "{e}");

    // The env plugin without the svc plugin.
    let e = failed(&o, &[vars[0]]);
    assert!(
        e.contains("svc plugin") && e.contains("VC_TASK_INDEX=1"),
        "{e}"
    );
}

#[test]
fn volcano_multi_task_ranks_master_first_then_alphabetically() {
    let dir = TempDir::new("vc-multi");
    dir.write("master.host", "j-master-0.j\n");
    dir.write("worker.host", "j-worker-0.j\nj-worker-1.j\nj-worker-2.j\n");
    dir.write("eval_x.host", "j-eval-x-0.j\nj-eval-x-1.j\n");
    let vars = [("VC_TASK_INDEX", "1")];
    let d = found(&with_host(Launcher::Auto, "j-worker-1", &dir), &vars);
    // master (1), eval-x (2), worker (3): worker 1 is rank 1 + 2 + 1.
    assert_eq!(pos(&d), (4, 6, 0, 1));
    assert_eq!(d.world.master_addr, "j-master-0.j");
    let d = found(&with_host(Launcher::Auto, "j-eval-x-1.j", &dir), &vars);
    assert_eq!(d.world.rank, 2);
    let d = found(
        &with_host(Launcher::Auto, "j-master-0", &dir),
        &[("VC_TASK_INDEX", "0")],
    );
    assert_eq!(d.world.rank, 0);

    // hostNetwork: the node's name matches no task, the pod name does.
    let o = with_host(Launcher::Auto, "gpu-node-3", &dir);
    let e = failed(&o, &vars);
    assert!(
        e.contains("POD_NAME") && e.contains("master, eval_x, worker"),
        "{e}"
    );
    let d = found(&o, &[vars[0], ("POD_NAME", "j-worker-1")]);
    assert_eq!(d.world.rank, 4);

    // Variables override files task by task, with '-' in the task name read as '_'.
    let d = found(
        &with_host(Launcher::Auto, "j-worker-1", &dir),
        &[vars[0], ("VC_MASTER_NUM", "1"), ("VC_EVAL_X_NUM", "2")],
    );
    assert_eq!(d.world.rank, 4);
}

#[test]
fn volcano_tasks_from_listed_variables() {
    // Only variables, several tasks: the pod name names one task, the listing the others.
    let dir = TempDir::new("vc-listed");
    let vars = [
        ("VC_TASK_INDEX", "0"),
        ("VC_MASTER_HOSTS", "j-master-0.j"),
        ("VC_MASTER_NUM", "1"),
        ("VC_MPI_WORKER_HOSTS", "j-mpi-worker-0.j,j-mpi-worker-1.j"),
        ("VC_MPI_WORKER_NUM", "2"),
    ];
    let o = with_host(Launcher::Auto, "j-mpi-worker-0", &dir);
    let names: Vec<String> = vars.iter().map(|(k, _)| k.to_string()).collect();
    let d = detect_with_names(&o, &env(&vars), &names).unwrap().unwrap();
    assert_eq!(pos(&d), (1, 3, 0, 1));
    assert_eq!(d.world.master_addr, "j-master-0.j");
    // Without the listing, the master task is invisible and the notes say so.
    let d = found(&o, &vars);
    assert_eq!(pos(&d), (0, 2, 0, 1));
    assert!(
        d.notes.iter().any(|n| n.contains("pod name alone")),
        "{:?}",
        d.notes
    );
}

#[test]
fn slurm_step() {
    let vars = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_NODEID", "2"),
        ("SLURM_TASKS_PER_NODE", "2(x4)"),
        ("SLURM_JOB_NODELIST", "node[01-04,07],gpu-a[1-2]"),
    ];
    let d = found(&opts(Launcher::Auto), &vars);
    assert_eq!(d.source, Launcher::Slurm);
    assert_eq!(pos(&d), (5, 8, 1, 2));
    assert_eq!(d.world.store_addr().unwrap(), "node01:29500");

    // The step's own list and --ntasks-per-node win; uneven nodes go by SLURM_NODEID.
    let mut v = vars.to_vec();
    v.push(("SLURM_STEP_NODELIST", "rack1-node[3-4]"));
    v[4] = ("SLURM_STEP_TASKS_PER_NODE", "3(x2),2");
    let d = found(&opts(Launcher::Slurm), &v);
    assert_eq!(d.world.master_addr, "rack1-node3");
    assert_eq!(pos(&d), (5, 8, 1, 2));
    v[3] = ("SLURM_NODEID", "0");
    assert_eq!(pos(&found(&opts(Launcher::Slurm), &v)), (5, 8, 1, 3));
    v.push(("SLURM_NTASKS_PER_NODE", "4"));
    assert_eq!(pos(&found(&opts(Launcher::Slurm), &v)), (5, 8, 1, 4));

    // Legacy SLURM_NPROCS, and no per-node count at all.
    let d = found(
        &opts(Launcher::Auto),
        &[("SLURM_PROCID", "0"), ("SLURM_NPROCS", "1")],
    );
    assert_eq!(pos(&d), (0, 1, 0, 1));
    assert_eq!(d.world.store_addr(), None);

    // A batch script's own task id without --ntasks is not a job of ranks.
    assert_eq!(
        run(&opts(Launcher::Auto), &[("SLURM_PROCID", "0")]).unwrap(),
        None
    );

    let e = failed(&opts(Launcher::Auto), &[vars[0], ("SLURM_NTASKS", "4")]);
    assert!(e.contains("SLURM_PROCID=\"5\""), "{e}");
    let mut bad = vars.to_vec();
    bad[5] = ("SLURM_JOB_NODELIST", "node[01-");
    let e = failed(&opts(Launcher::Auto), &bad);
    assert!(
        e.contains("SLURM_JOB_NODELIST=\"node[01-\"") && e.contains("never closed"),
        "{e}"
    );
    let mut bad = vars.to_vec();
    bad[2] = ("SLURM_LOCALID", "2");
    let e = failed(&opts(Launcher::Auto), &bad);
    assert!(e.contains("SLURM_LOCALID=\"2\""), "{e}");
    let mut bad = vars.to_vec();
    bad[4] = ("SLURM_TASKS_PER_NODE", "2(x2)");
    let e = failed(&opts(Launcher::Auto), &bad);
    assert!(e.contains("SLURM_NODEID=\"2\""), "{e}");
    let e = failed(
        &opts(Launcher::Auto),
        &[vars[0], vars[1], ("SLURM_LOCALID", "-1")],
    );
    assert!(e.contains("SLURM_LOCALID=\"-1\""), "{e}");
    // No node list: the address must come from elsewhere.
    let e = failed(&opts(Launcher::Auto), &vars[..5]);
    assert!(e.contains("MASTER_ADDR") && e.contains("node list"), "{e}");
}

#[test]
fn mpi_launchers() {
    let ompi = [
        ("OMPI_COMM_WORLD_RANK", "6"),
        ("OMPI_COMM_WORLD_SIZE", "16"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "6"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "8"),
    ];
    let e = failed(&opts(Launcher::Auto), &ompi);
    assert!(
        e.contains("MASTER_ADDR")
            && e.contains("mpirun -x MASTER_ADDR")
            && e.contains("--master-addr"),
        "{e}"
    );
    let mut v = ompi.to_vec();
    v.push(("MASTER_ADDR", "launcher-host"));
    let d = found(&opts(Launcher::Auto), &v);
    assert_eq!(d.source, Launcher::Mpi);
    assert_eq!(pos(&d), (6, 16, 6, 8));
    assert_eq!(d.world.store_addr().unwrap(), "launcher-host:29500");
    let o = DetectOptions {
        master_addr: Some("flag-host".into()),
        ..opts(Launcher::Mpi)
    };
    assert_eq!(found(&o, &v).world.master_addr, "flag-host");

    let pmi = [
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("MPI_LOCALRANKID", "1"),
        ("MPI_LOCALNRANKS", "2"),
        ("MASTER_ADDR", "h0"),
    ];
    let d = found(&opts(Launcher::Mpi), &pmi);
    assert_eq!((d.source, pos(&d)), (Launcher::Mpi, (3, 4, 1, 2)));
    let d = found(&opts(Launcher::Auto), &[pmi[0], pmi[1], pmi[4]]);
    assert_eq!(pos(&d), (3, 4, 0, 1));
    // A one-rank MPI job needs no address.
    let d = found(
        &opts(Launcher::Auto),
        &[("PMI_RANK", "0"), ("PMI_SIZE", "1")],
    );
    assert_eq!(d.world.store_addr(), None);

    let e = failed(&opts(Launcher::Auto), &[("OMPI_COMM_WORLD_RANK", "0")]);
    assert!(e.starts_with("OMPI_COMM_WORLD_SIZE "), "{e}");
    let e = failed(
        &opts(Launcher::Auto),
        &[("PMI_RANK", "4"), ("PMI_SIZE", "4")],
    );
    assert!(e.contains("PMI_RANK=\"4\""), "{e}");
    let e = failed(
        &opts(Launcher::Auto),
        &[
            ompi[0],
            ompi[1],
            ("OMPI_COMM_WORLD_LOCAL_RANK", "8"),
            ompi[3],
        ],
    );
    assert!(e.contains("OMPI_COMM_WORLD_LOCAL_RANK=\"8\""), "{e}");
}

#[test]
fn mpirun_inside_an_allocation_beats_the_allocation() {
    // Rank 3 of 16 started by mpirun inside an sbatch script: Slurm's variables describe the
    // batch step (task 0 of 16), Open MPI's the rank.
    let v = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "16"),
        ("MASTER_ADDR", "gpu01"),
    ];
    let d = found(&opts(Launcher::Auto), &v);
    assert_eq!(
        (d.source, d.world.rank, d.world.size),
        (Launcher::Mpi, 3, 16)
    );
    assert!(d.notes.iter().any(|n| n.contains("wins")), "{:?}", d.notes);

    // srun with PMI: both agree, Slurm is used and supplies rank 0's host.
    let v = [
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ("SLURM_LOCALID", "0"),
        ("SLURM_TASKS_PER_NODE", "2(x2)"),
        ("PMI_RANK", "2"),
        ("PMI_SIZE", "4"),
    ];
    let d = found(&opts(Launcher::Auto), &v);
    assert_eq!((d.source, pos(&d)), (Launcher::Slurm, (2, 4, 0, 2)));
    assert_eq!(d.world.master_addr, "gpu01");
    assert!(d.notes.iter().any(|n| n.contains("agree")), "{:?}", d.notes);

    // An enclosing launcher that cannot be read does not stop the MPI one.
    let v = [
        ("VC_TASK_INDEX", "0"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "m"),
    ];
    let d = found(&opts(Launcher::Auto), &v);
    assert_eq!((d.source, d.world.rank), (Launcher::Mpi, 1));
}

#[test]
fn auto_order() {
    let dir = TempDir::new("vc-order");
    dir.write("rank.host", HOSTS4);
    let o = with_host(Launcher::Auto, "job-rank-1", &dir);
    let torch = [("RANK", "0"), ("WORLD_SIZE", "1")];
    let volcano = [("VC_TASK_INDEX", "1")];
    let slurm = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_NODELIST", "n1"),
    ];
    let k8s = [
        ("JOB_COMPLETION_INDEX", "1"),
        ("BUSBW_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "a"),
    ];
    let all: Vec<_> = [&torch[..], &volcano, &slurm, &k8s].concat();
    assert_eq!(found(&o, &all).source, Launcher::Env);
    assert_eq!(found(&o, &all[2..]).source, Launcher::Volcano);
    assert_eq!(found(&o, &all[3..]).source, Launcher::Slurm);
    assert_eq!(found(&o, &all[6..]).source, Launcher::K8s);
    assert!(found(&o, &all).notes[0].starts_with("auto:"));
}

#[test]
fn indexed_jobs_and_jobsets() {
    let o = opts(Launcher::Auto);
    let d = found(
        &o,
        &[
            ("JOB_COMPLETION_INDEX", "3"),
            ("BUSBW_WORLD_SIZE", "4"),
            ("BUSBW_HOST_PATTERN", "bench-{index}.bench"),
        ],
    );
    assert_eq!(d.source, Launcher::K8s);
    assert_eq!(pos(&d), (3, 4, 0, 1));
    assert_eq!(d.world.store_addr().unwrap(), "bench-0.bench:29500");

    // JobSet: the default pattern from the downward-API variables.
    let js = [
        ("JOB_COMPLETION_INDEX", "2"),
        ("JOBSET_NAME", "pre"),
        ("REPLICATED_JOB_NAME", "ranks"),
        ("JOB_INDEX", "0"),
    ];
    let o2 = DetectOptions {
        world_size: Some(8),
        ..opts(Launcher::K8s)
    };
    let d = found(&o2, &js);
    assert_eq!((d.world.rank, d.world.size), (2, 8));
    assert_eq!(d.world.master_addr, "pre-ranks-0-0.pre");
    // An explicit pattern beats the derived one; --world-size beats BUSBW_WORLD_SIZE.
    let o3 = DetectOptions {
        host_pattern: Some("r{index}.custom-sub".into()),
        ..o2.clone()
    };
    let d = found(&o3, &[js[0], js[1], js[2], ("BUSBW_WORLD_SIZE", "3")]);
    assert_eq!(
        (d.world.size, d.world.master_addr.as_str()),
        (8, "r0.custom-sub")
    );

    let e = failed(&o2, &[js[0], js[1], js[2], ("JOB_INDEX", "1")]);
    assert!(
        e.contains("JOB_INDEX=\"1\"") && e.contains("replicas: 1"),
        "{e}"
    );
    let e = failed(&o, &js);
    assert!(
        e.starts_with("BUSBW_WORLD_SIZE ") && e.contains("--world-size"),
        "{e}"
    );
    let e = failed(&o2, &[js[0]]);
    assert!(
        e.contains("MASTER_ADDR") && e.contains("--host-pattern"),
        "{e}"
    );
    let e = failed(&o2, &[("JOB_COMPLETION_INDEX", "8")]);
    assert!(e.contains("JOB_COMPLETION_INDEX=\"8\""), "{e}");
    let e = failed(&o2, &[js[0], ("BUSBW_HOST_PATTERN", "r{idx}.s")]);
    assert!(e.contains("BUSBW_HOST_PATTERN=\"r{idx}.s\""), "{e}");
    let e = failed(&o, &[js[0], ("BUSBW_WORLD_SIZE", "0")]);
    assert!(e.contains("BUSBW_WORLD_SIZE=\"0\""), "{e}");
    // One pod needs no pattern.
    let d = found(
        &o,
        &[("JOB_COMPLETION_INDEX", "0"), ("BUSBW_WORLD_SIZE", "1")],
    );
    assert_eq!(d.world.store_addr(), None);
}

/// A misspelt `BUSBW_PLATFORM` stops every process before it joins a job, whether a launcher
/// described one or not, naming the values this build takes; a valid or empty one is fine.
#[test]
fn a_misspelt_platform_is_a_usage_error() {
    for launcher in [Launcher::Auto, Launcher::Local] {
        let e = run(&opts(launcher), &[("BUSBW_PLATFORM", "portabel")]).unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(
                e,
                WorldError::Invalid {
                    var: "BUSBW_PLATFORM",
                    ..
                }
            ),
            "{text}"
        );
        assert!(
            text.contains("\"portabel\"") && text.contains("portable"),
            "{text}"
        );
    }
    for ok in ["portable", "", " Portable "] {
        assert!(
            run(&opts(Launcher::Auto), &[("BUSBW_PLATFORM", ok)]).is_ok(),
            "{ok:?}"
        );
    }
    let torchrun = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("BUSBW_PLATFORM", "windows"),
    ];
    assert!(run(&opts(Launcher::Auto), &torchrun).is_err());
}
