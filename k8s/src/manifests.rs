//! The objects themselves. One builder per kind over shared pieces (the busbw container, the
//! pod spec, the RBAC), so that the three schedulers run the same pods.

use super::yaml::{comment, int, list, map, s, strs, Y};
use super::{Part, RenderArgs, Scheduler, TopologyMode};

/// Service account of the job's pods: may read nodes (topology labels) and, opt-in, patch them.
const SERVICE_ACCOUNT: &str = "busbw";
const READER: &str = "busbw-node-reader";
const LABELER: &str = "busbw-node-labeler";
const RUNNER: &str = "busbw-nightly";
/// Volcano task name: the svc plugin's VC_RANK_HOSTS / VC_RANK_NUM / /etc/volcano/rank.host.
const TASK: &str = "rank";
const DEFAULT_SWEEP: [&str; 6] = ["-b", "1M", "-e", "1G", "-f", "2"];
/// Placeholder the nightly runner replaces with the run's time stamp.
pub const RUN: &str = "@RUN@";

/// Checked options with the defaults filled in.
struct Ctx<'a> {
    a: &'a RenderArgs,
    name: String,
    image: String,
}

pub fn render(a: &RenderArgs) -> Result<Vec<Y>, String> {
    check(a)?;
    let name = a.name.clone().unwrap_or_else(|| {
        if a.nightly {
            "busbw-nightly".into()
        } else {
            "busbw-gate".into()
        }
    });
    check_name(&name, a)?;
    let image = a.image.clone().unwrap_or_else(|| match a.scheduler {
        Scheduler::Mpi => "busbw:mpi".into(),
        _ => "busbw:latest".into(),
    });
    let cx = Ctx { a, name, image };
    let mut docs = Vec::new();
    if matches!(a.part, Part::All | Part::Rbac) {
        docs.extend(rbac(&cx));
    }
    if matches!(a.part, Part::LabelerRbac) || (a.part == Part::All && a.label_nodes.is_some()) {
        docs.extend(labeler_rbac(&cx));
    }
    if matches!(a.part, Part::All | Part::Job) {
        if a.nightly {
            docs.extend(nightly(&cx));
        } else {
            docs.push(job(&cx, &gate_args(&cx)));
        }
    }
    Ok(docs)
}

fn check(a: &RenderArgs) -> Result<(), String> {
    if a.nodes == 0 {
        return Err("--nodes 0: a job needs at least one pod".into());
    }
    if a.gpus_per_node == 0 {
        return Err("--gpus-per-node 0: each pod runs at least one rank".into());
    }
    if a.pytorch && a.scheduler != Scheduler::Volcano {
        return Err("--pytorch is a Volcano plugin: use it with --scheduler volcano".into());
    }
    if a.pytorch && a.nodes < 2 {
        return Err("--pytorch needs --nodes 2 or more (one master pod and the workers)".into());
    }
    if a.network_topology.is_some() && a.scheduler != Scheduler::Volcano {
        return Err(
            "--network-topology is Volcano's; with Kueue use --topology-level (and --topology-preferred)"
                .into(),
        );
    }
    if a.topology_level.is_some() && a.scheduler != Scheduler::Kueue {
        return Err(
            "--topology-level is Kueue's; with Volcano use --network-topology hard|soft --highest-tier N"
                .into(),
        );
    }
    if a.nightly {
        if a.scheduler != Scheduler::Volcano {
            return Err("--nightly creates a Volcano Job: use --scheduler volcano".into());
        }
        if a.report_pvc.is_none() {
            return Err(
                "--nightly keeps its results and baseline on a volume: give --report-pvc CLAIM"
                    .into(),
            );
        }
        if a.label_nodes.is_some() {
            return Err("--label-nodes belongs to the gate job, not to --nightly".into());
        }
    }
    if let Some(kv) = &a.label_nodes {
        split_kv(kv, "--label-nodes")?;
    }
    if let Some(kv) = &a.rdma_resource {
        let (_, n) = split_kv(kv, "--rdma-resource")?;
        if n.parse::<u32>().map_or(true, |n| n == 0) {
            return Err(format!(
                "--rdma-resource {kv}: COUNT must be a positive integer"
            ));
        }
    }
    if let Some(u) = &a.push_gateway {
        if !u.starts_with("http://") {
            return Err(format!(
                "--push-gateway {u}: busbw pushes over plain HTTP (http://HOST[:PORT])"
            ));
        }
    }
    Ok(())
}

fn split_kv<'s>(kv: &'s str, flag: &str) -> Result<(&'s str, &'s str), String> {
    match kv.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k, v)),
        _ => Err(format!("{flag} {kv}: expected KEY=VALUE")),
    }
}

/// Pod names are `<job>-<task>-<index>` and become host names: at most 63 characters. The
/// nightly's job names carry a 15-character time stamp.
fn check_name(name: &str, a: &RenderArgs) -> Result<(), String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.as_bytes()[0].is_ascii_lowercase()
        && !name.ends_with('-');
    if !ok {
        return Err(format!(
            "--name {name:?}: a job name is lower-case letters, digits and '-', starting with a letter"
        ));
    }
    let longest_pod = name.len()
        + if a.nightly { 16 } else { 0 }
        + "-worker-".len()
        + (a.nodes.max(1) - 1).to_string().len();
    if longest_pod > 63 {
        return Err(format!(
            "--name {name}: pod names would reach {longest_pod} characters, over the 63 of a host name; shorten it"
        ));
    }
    Ok(())
}

fn metadata(cx: &Ctx, name: &str, namespaced: bool, extra_labels: Vec<(&str, Y)>) -> Y {
    let mut labels = vec![
        ("app.kubernetes.io/name", s("busbw")),
        (
            "app.kubernetes.io/component",
            s(if cx.a.nightly { "nightly" } else { "gate" }),
        ),
    ];
    labels.extend(extra_labels);
    let mut m = map(vec![("name", s(name))]);
    if namespaced {
        if let Some(ns) = &cx.a.namespace {
            m.push("namespace", s(ns));
        }
    }
    m.push("labels", map(labels));
    m
}

fn namespace_or_default(cx: &Ctx) -> String {
    cx.a.namespace.clone().unwrap_or_else(|| "default".into())
}

fn rbac(cx: &Ctx) -> Vec<Y> {
    vec![
        map(vec![
            ("apiVersion", s("v1")),
            ("kind", s("ServiceAccount")),
            ("metadata", metadata(cx, SERVICE_ACCOUNT, true, vec![])),
        ]),
        map(vec![
            ("apiVersion", s("rbac.authorization.k8s.io/v1")),
            ("kind", s("ClusterRole")),
            ("metadata", metadata(cx, READER, false, vec![])),
            comment("busbw tiers --topology-source k8s reads its node's labels (GET /api/v1/nodes/NAME)\nand Volcano HyperNodes when the preset is volcano."),
            (
                "rules",
                list(vec![
                    map(vec![
                        ("apiGroups", strs(&[""])),
                        ("resources", strs(&["nodes"])),
                        ("verbs", strs(&["get", "list"])),
                    ]),
                    map(vec![
                        ("apiGroups", strs(&["topology.volcano.sh"])),
                        ("resources", strs(&["hypernodes"])),
                        ("verbs", strs(&["get", "list"])),
                    ]),
                ]),
            ),
        ]),
        binding(cx, "ClusterRoleBinding", READER, SERVICE_ACCOUNT),
    ]
}

fn labeler_rbac(cx: &Ctx) -> Vec<Y> {
    vec![
        map(vec![
            ("apiVersion", s("rbac.authorization.k8s.io/v1")),
            ("kind", s("ClusterRole")),
            ("metadata", metadata(cx, LABELER, false, vec![])),
            comment("Opt-in: busbw tiers --label-nodes KEY=VALUE patches node labels (the gate before training).\nApply it only where the job should mark nodes."),
            (
                "rules",
                list(vec![map(vec![
                    ("apiGroups", strs(&[""])),
                    ("resources", strs(&["nodes"])),
                    ("verbs", strs(&["get", "patch"])),
                ])]),
            ),
        ]),
        binding(cx, "ClusterRoleBinding", LABELER, SERVICE_ACCOUNT),
    ]
}

fn binding(cx: &Ctx, kind: &str, role: &str, account: &str) -> Y {
    let role_kind = if kind == "ClusterRoleBinding" {
        "ClusterRole"
    } else {
        "Role"
    };
    map(vec![
        ("apiVersion", s("rbac.authorization.k8s.io/v1")),
        ("kind", s(kind)),
        (
            "metadata",
            metadata(cx, role, kind == "RoleBinding", vec![]),
        ),
        (
            "roleRef",
            map(vec![
                ("apiGroup", s("rbac.authorization.k8s.io")),
                ("kind", s(role_kind)),
                ("name", s(role)),
            ]),
        ),
        (
            "subjects",
            list(vec![map(vec![
                ("kind", s("ServiceAccount")),
                ("name", s(account)),
                ("namespace", s(namespace_or_default(cx))),
            ])]),
        ),
    ])
}

fn sweep(cx: &Ctx) -> Vec<String> {
    if cx.a.busbw_args.is_empty() {
        DEFAULT_SWEEP.iter().map(|w| w.to_string()).collect()
    } else {
        cx.a.busbw_args.clone()
    }
}

fn launcher(cx: &Ctx) -> &'static str {
    match (cx.a.scheduler, cx.a.pytorch) {
        (Scheduler::Volcano, false) => "volcano",
        (Scheduler::Volcano, true) => "env",
        (Scheduler::Kueue, _) => "k8s",
        (Scheduler::Mpi, _) => "mpi",
    }
}

/// The busbw command line of the gate: `busbw tiers` with the launcher, the topology and
/// the report flags.
fn gate_args(cx: &Ctx) -> Vec<String> {
    let a = cx.a;
    let mut v: Vec<String> = vec!["tiers".into(), "--launcher".into(), launcher(cx).into()];
    v.extend(["--port".into(), a.port.to_string()]);
    v.extend(["--topology-preset".into(), a.topology_preset.clone()]);
    v.extend(["--topology-source".into(), a.topology_source.clone()]);
    v.extend(sweep(cx));
    if a.report_pvc.is_some() {
        v.extend(["--export-json".into(), format!("/results/{}.json", cx.name)]);
    }
    if let Some(kv) = &a.label_nodes {
        v.extend(["--label-nodes".into(), kv.clone()]);
    }
    v
}

/// The nightly's measurement: the whole-job sweep, saved and pushed.
fn nightly_args(cx: &Ctx) -> Vec<String> {
    let a = cx.a;
    let mut v: Vec<String> = vec![
        "all_reduce_perf".into(),
        "--launcher".into(),
        launcher(cx).into(),
        "--port".into(),
        a.port.to_string(),
    ];
    v.extend(sweep(cx));
    v.extend(["--export-json".into(), format!("/results/runs/{RUN}.json")]);
    if let Some(u) = &a.push_gateway {
        v.extend([
            "--push-gateway".into(),
            u.clone(),
            "--prometheus-job".into(),
            cx.name.clone(),
        ]);
    }
    v
}

fn field_env(name: &str, path: &str) -> Y {
    map(vec![
        ("name", s(name)),
        (
            "valueFrom",
            map(vec![("fieldRef", map(vec![("fieldPath", s(path))]))]),
        ),
    ])
}

fn value_env(name: &str, value: impl Into<String>) -> Y {
    map(vec![("name", s(name)), ("value", s(value))])
}

/// Environment of every busbw container: this node's name for the topology lookup and the
/// node labels, the pod's name for Volcano's task lookup under hostNetwork, ranks per pod.
fn common_env(cx: &Ctx) -> Vec<Y> {
    let mut env = vec![
        field_env("NODE_NAME", "spec.nodeName"),
        field_env("POD_NAME", "metadata.name"),
    ];
    if cx.a.scheduler != Scheduler::Mpi {
        env.push(value_env(
            "BUSBW_NPROC_PER_NODE",
            cx.a.gpus_per_node.to_string(),
        ));
    }
    env
}

fn resources(cx: &Ctx) -> Vec<(String, Y)> {
    let g = cx.a.gpus_per_node;
    let mut limits = Vec::new();
    if cx.a.request_gpus {
        limits.push(("nvidia.com/gpu".to_string(), int(g as i64)));
    }
    if let Some((k, n)) =
        cx.a.rdma_resource
            .as_deref()
            .and_then(|kv| kv.split_once('='))
    {
        limits.push((k.to_string(), int(n.parse::<i64>().unwrap_or(1))));
    }
    let mut out = Vec::new();
    if !cx.a.request_gpus || cx.a.rdma_resource.is_none() {
        let mut c = String::from("Resources, as options (busbw k8s render --request-gpus / --rdma-resource NAME=COUNT):\n");
        if !cx.a.request_gpus {
            c.push_str(&format!(
                "  limits: {{nvidia.com/gpu: {g}}}            claim the node's GPUs (one rank per GPU)\n"
            ));
        }
        if cx.a.rdma_resource.is_none() {
            c.push_str(
                "  limits: {rdma/hca_shared_devices_a: 1}   RDMA shared device plugin, or\n",
            );
            c.push_str(
                "  limits: {nvidia.com/rdma-vf: 16}         SR-IOV VFs (NVIDIA Network Operator)",
            );
        }
        out.push((String::new(), Y::Comment(c.trim_end().to_string())));
    }
    let res = if limits.is_empty() {
        Y::Map(vec![])
    } else {
        Y::Map(vec![("limits".to_string(), Y::Map(limits))])
    };
    out.push(("resources".into(), res));
    out
}

fn container(cx: &Ctx, command: Y, args: Y, env: Vec<Y>, main: bool) -> Y {
    let mut c = vec![
        ("name".to_string(), s("busbw")),
        ("image".into(), s(&cx.image)),
        ("imagePullPolicy".into(), s("IfNotPresent")),
        ("command".into(), command),
        ("args".into(), args),
        ("env".into(), list(env)),
    ];
    if main {
        c.push((
            "ports".into(),
            list(vec![map(vec![
                ("name", s("rendezvous")),
                ("containerPort", int(cx.a.port as i64)),
            ])]),
        ));
        c.extend(resources(cx));
    }
    if cx.a.report_pvc.is_some() && cx.a.scheduler != Scheduler::Volcano {
        c.push((
            "volumeMounts".into(),
            list(vec![map(vec![
                ("name", s("results")),
                ("mountPath", s("/results")),
            ])]),
        ));
    }
    Y::Map(c)
}

/// The pod spec every scheduler's pods share.
fn pod_spec(cx: &Ctx, containers: Vec<Y>, restart: &str, extra: Vec<(&str, Y)>) -> Y {
    let mut p = map(extra);
    p.push("serviceAccountName", s(SERVICE_ACCOUNT));
    p.push("restartPolicy", s(restart));
    p.push("terminationGracePeriodSeconds", int(10));
    if cx.a.host_network {
        p.push("hostNetwork", Y::Bool(true));
        p.push("dnsPolicy", s("ClusterFirstWithHostNet"));
    } else {
        p.note("hostNetwork: true with dnsPolicy: ClusterFirstWithHostNet (--host-network) runs on the node's\ninterfaces, as RoCE without SR-IOV needs; the rendezvous port must then be free on every node.");
    }
    p.push(
        "tolerations",
        list(vec![map(vec![
            ("key", s("nvidia.com/gpu")),
            ("operator", s("Exists")),
            ("effect", s("NoSchedule")),
        ])]),
    );
    p.push("containers", list(containers));
    if cx.a.report_pvc.is_some() && cx.a.scheduler != Scheduler::Volcano {
        p.push(
            "volumes",
            list(vec![map(vec![
                ("name", s("results")),
                (
                    "persistentVolumeClaim",
                    map(vec![(
                        "claimName",
                        s(cx.a.report_pvc.clone().unwrap_or_default()),
                    )]),
                ),
            ])]),
        );
    }
    p
}

fn job(cx: &Ctx, busbw_args: &[String]) -> Y {
    match cx.a.scheduler {
        Scheduler::Volcano => volcano(cx, busbw_args, &cx.name),
        Scheduler::Kueue => jobset(cx, busbw_args),
        Scheduler::Mpi => mpijob(cx, busbw_args),
    }
}

fn template(labels: Vec<(&str, Y)>, annotations: Vec<(&str, Y)>, spec: Y) -> Y {
    let mut meta = map(vec![("labels", map(labels))]);
    if !annotations.is_empty() {
        meta.push("annotations", map(annotations));
    }
    map(vec![("metadata", meta), ("spec", spec)])
}

fn volcano(cx: &Ctx, busbw_args: &[String], name: &str) -> Y {
    let a = cx.a;
    let n = a.nodes;
    let busbw_pod = |role: &str| {
        let c = container(cx, strs(&["busbw"]), strs(busbw_args), common_env(cx), true);
        template(
            vec![
                ("app.kubernetes.io/name", s("busbw")),
                ("busbw.dev/role", s(role)),
            ],
            vec![],
            pod_spec(cx, vec![c], "Never", vec![]),
        )
    };
    let task = |tname: &str, replicas: usize| {
        map(vec![
            ("name", s(tname)),
            ("replicas", int(replicas as i64)),
            ("minAvailable", int(replicas as i64)),
            ("template", busbw_pod(tname)),
        ])
    };
    let (plugins, tasks) = if a.pytorch {
        (
            map(vec![
                (
                    "pytorch",
                    strs(&[
                        "--master=master".to_string(),
                        "--worker=worker".to_string(),
                        format!("--port={}", a.port),
                    ]),
                ),
                (
                    "svc",
                    strs(&[
                        "--publish-not-ready-addresses=true",
                        "--disable-network-policy=true",
                    ]),
                ),
            ]),
            vec![task("master", 1), task("worker", n - 1)],
        )
    } else {
        (
            map(vec![
                ("env", list(vec![])),
                (
                    "svc",
                    strs(&[
                        "--publish-not-ready-addresses=true",
                        "--disable-network-policy=true",
                    ]),
                ),
            ]),
            vec![task(TASK, n)],
        )
    };
    let mut spec = map(vec![
        ("schedulerName", s("volcano")),
        ("queue", s(&a.queue)),
        comment("Gang: every pod or none. A rank never waits for a pod that cannot start."),
        ("minAvailable", int(n as i64)),
        comment("Eviction is the node's business, not the fabric's: restart the whole job, at most maxRetry times.\nA failed rank (bad link, wrong data, peer timeout) ends the job: its exit code is the result."),
        ("maxRetry", int(2)),
        ("ttlSecondsAfterFinished", int(86400)),
        (
            "policies",
            list(vec![
                map(vec![("event", s("PodEvicted")), ("action", s("RestartJob"))]),
                map(vec![("event", s("PodFailed")), ("action", s("AbortJob"))]),
                map(vec![("event", s("TaskCompleted")), ("action", s("CompleteJob"))]),
            ]),
        ),
        comment("svc: headless service <job>, /etc/volcano/<task>.host, VC_<TASK>_HOSTS/NUM; ready or not, so\nrank 0's address resolves before every pod is Ready. No NetworkPolicy: ranks and a Pushgateway talk."),
        ("plugins", plugins),
    ]);
    match a.network_topology {
        Some(mode) => {
            let mut nt = map(vec![(
                "mode",
                s(match mode {
                    TopologyMode::Hard => "hard",
                    TopologyMode::Soft => "soft",
                }),
            )]);
            if let Some(t) = a.highest_tier {
                nt.push("highestTierAllowed", int(t as i64));
            }
            spec.push("networkTopology", nt);
        }
        None => {
            spec.note("Network-topology-aware placement (HyperNodes), --network-topology hard|soft --highest-tier N:\nnetworkTopology: {mode: hard, highestTierAllowed: 1}");
        }
    }
    if let Some(pvc) = &a.report_pvc {
        spec.push(
            "volumes",
            list(vec![map(vec![
                ("mountPath", s("/results")),
                ("volumeClaimName", s(pvc)),
            ])]),
        );
    } else {
        spec.note("The report is rank 0's log: kubectl logs <job>-rank-0 (--report-pvc CLAIM writes /results/<job>.json).");
    }
    spec.push("tasks", list(tasks));
    map(vec![
        ("apiVersion", s("batch.volcano.sh/v1alpha1")),
        ("kind", s("Job")),
        ("metadata", metadata(cx, name, true, vec![])),
        ("spec", spec),
    ])
}

fn jobset(cx: &Ctx, busbw_args: &[String]) -> Y {
    let a = cx.a;
    let n = a.nodes as i64;
    let label = |l: &str| format!("metadata.labels['jobset.sigs.k8s.io/{l}']");
    let mut env = common_env(cx);
    env.push(value_env("BUSBW_WORLD_SIZE", a.nodes.to_string()));
    env.push(field_env("JOBSET_NAME", &label("jobset-name")));
    env.push(field_env(
        "REPLICATED_JOB_NAME",
        &label("replicatedjob-name"),
    ));
    env.push(field_env("JOB_INDEX", &label("job-index")));
    let c = container(cx, strs(&["busbw"]), strs(busbw_args), env, true);
    let mut annotations = Vec::new();
    match &a.topology_level {
        Some(level) => annotations.push((
            if a.topology_preferred {
                "kueue.x-k8s.io/podset-preferred-topology"
            } else {
                "kueue.x-k8s.io/podset-required-topology"
            },
            s(level),
        )),
        None => annotations.push(("", Y::Comment("Topology-aware scheduling (--topology-level KEY [--topology-preferred]):\nkueue.x-k8s.io/podset-required-topology: oci.oraclecloud.com/rdma.network_block_id".into()))),
    }
    let pod = template(
        vec![("app.kubernetes.io/name", s("busbw"))],
        annotations,
        pod_spec(cx, vec![c], "Never", vec![]),
    );
    let child = map(vec![(
        "spec",
        map(vec![
            ("completionMode", s("Indexed")),
            ("completions", int(n)),
            ("parallelism", int(n)),
            ("backoffLimit", int(0)),
            ("template", pod),
        ]),
    )]);
    map(vec![
        ("apiVersion", s("jobset.x-k8s.io/v1alpha2")),
        ("kind", s("JobSet")),
        (
            "metadata",
            metadata(
                cx,
                &cx.name,
                true,
                vec![("kueue.x-k8s.io/queue-name", s(&a.queue))],
            ),
        ),
        (
            "spec",
            map(vec![
                comment("Kueue admits the whole JobSet at once (gang) and unsuspends it."),
                ("suspend", Y::Bool(true)),
                (
                    "network",
                    map(vec![
                        ("enableDNSHostnames", Y::Bool(true)),
                        ("publishNotReadyAddresses", Y::Bool(true)),
                    ]),
                ),
                comment("A failed rank is the result: no restarts."),
                ("failurePolicy", map(vec![("maxRestarts", int(0))])),
                ("ttlSecondsAfterFinished", int(86400)),
                (
                    "replicatedJobs",
                    list(vec![map(vec![
                        ("name", s(TASK)),
                        ("replicas", int(1)),
                        ("template", child),
                    ])]),
                ),
            ]),
        ),
    ])
}

fn mpijob(cx: &Ctx, busbw_args: &[String]) -> Y {
    let a = cx.a;
    let g = a.gpus_per_node;
    let n = a.nodes;
    // Ranks start through ssh, with sshd's environment: the worker leaves its node's name in
    // a file for them.
    let node_file = "/run/busbw-node-name";
    let rank_cmd = format!(
        "NODE_NAME=`cat {node_file}` exec busbw {}",
        busbw_args
            .iter()
            .map(|w| super::shell_word(w))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut launcher_args: Vec<String> = vec![
        "--allow-run-as-root".into(),
        "-np".into(),
        (n * g).to_string(),
        "-npernode".into(),
        g.to_string(),
        "--bind-to".into(),
        "none".into(),
        "-x".into(),
        format!("MASTER_ADDR={}-worker-0.{}", cx.name, cx.name),
        "-x".into(),
        format!("MASTER_PORT={}", a.port),
    ];
    launcher_args.extend(["sh".into(), "-c".into(), rank_cmd]);
    let launcher = container(cx, strs(&["mpirun"]), strs(&launcher_args), vec![], false);
    let worker = container(
        cx,
        strs(&["sh", "-c"]),
        strs(&[format!(
            "echo \"$NODE_NAME\" > {node_file} && exec /usr/sbin/sshd -De"
        )]),
        common_env(cx),
        true,
    );
    let replica = |role: &str, replicas: usize, c: Y| {
        map(vec![
            ("replicas", int(replicas as i64)),
            ("restartPolicy", s("Never")),
            (
                "template",
                template(
                    vec![("app.kubernetes.io/name", s("busbw"))],
                    vec![],
                    pod_spec(cx, vec![c], "Never", vec![]),
                ),
            ),
        ])
        .with_comment_if(
            role == "Launcher",
            "mpirun runs here (no GPUs); rank 0 is on worker 0.",
        )
    };
    map(vec![
        ("apiVersion", s("kubeflow.org/v2beta1")),
        ("kind", s("MPIJob")),
        ("metadata", metadata(cx, &cx.name, true, vec![])),
        (
            "spec",
            map(vec![
                ("slotsPerWorker", int(g as i64)),
                ("mpiImplementation", s("OpenMPI")),
                ("launcherCreationPolicy", s("WaitForWorkersReady")),
                (
                    "runPolicy",
                    map(vec![
                        ("cleanPodPolicy", s("Running")),
                        ("backoffLimit", int(0)),
                        ("ttlSecondsAfterFinished", int(86400)),
                        comment("Gang scheduling when the operator runs with --gang-scheduling=volcano:"),
                        (
                            "schedulingPolicy",
                            map(vec![
                                ("minAvailable", int((n + 1) as i64)),
                                ("queue", s(&a.queue)),
                            ]),
                        ),
                    ]),
                ),
                (
                    "mpiReplicaSpecs",
                    map(vec![
                        ("Launcher", replica("Launcher", 1, launcher)),
                        ("Worker", replica("Worker", n, worker)),
                    ]),
                ),
            ]),
        ),
    ])
}

trait WithComment {
    fn with_comment_if(self, cond: bool, text: &str) -> Self;
}

impl WithComment for Y {
    fn with_comment_if(mut self, cond: bool, text: &str) -> Y {
        if cond {
            if let Y::Map(m) = &mut self {
                m.insert(0, (String::new(), Y::Comment(text.into())));
            }
        }
        self
    }
}

/// The nightly: results claim, the runner's account and role, the gang job as a template
/// in a ConfigMap, and the CronJob that creates it, waits, compares and keeps the baseline.
fn nightly(cx: &Ctx) -> Vec<Y> {
    let a = cx.a;
    let pvc = a.report_pvc.clone().unwrap_or_default();
    let job_name = format!("{}-{RUN}", cx.name);
    let job_yaml = volcano(cx, &nightly_args(cx), &job_name).to_yaml();
    let claim = map(vec![
        ("apiVersion", s("v1")),
        ("kind", s("PersistentVolumeClaim")),
        ("metadata", metadata(cx, &pvc, true, vec![])),
        comment("Every pod of the job mounts it (rank 0 writes): ReadWriteMany storage (NFS, OCI File Storage, ...)."),
        (
            "spec",
            map(vec![
                ("accessModes", strs(&["ReadWriteMany"])),
                (
                    "resources",
                    map(vec![("requests", map(vec![("storage", s(&a.results_size))]))]),
                ),
            ]),
        ),
    ]);
    let account = map(vec![
        ("apiVersion", s("v1")),
        ("kind", s("ServiceAccount")),
        ("metadata", metadata(cx, RUNNER, true, vec![])),
    ]);
    let role = map(vec![
        ("apiVersion", s("rbac.authorization.k8s.io/v1")),
        ("kind", s("Role")),
        ("metadata", metadata(cx, RUNNER, true, vec![])),
        (
            "rules",
            list(vec![map(vec![
                ("apiGroups", strs(&["batch.volcano.sh"])),
                ("resources", strs(&["jobs"])),
                ("verbs", strs(&["create", "get", "list", "delete"])),
            ])]),
        ),
    ]);
    let config = map(vec![
        ("apiVersion", s("v1")),
        ("kind", s("ConfigMap")),
        ("metadata", metadata(cx, RUNNER, true, vec![])),
        (
            "data",
            map(vec![
                ("job.yaml", s(job_yaml)),
                ("run.sh", s(RUNNER_SCRIPT)),
            ]),
        ),
    ]);
    let runner = map(vec![
        ("name", s("runner")),
        ("image", s(&a.runner_image)),
        ("imagePullPolicy", s("IfNotPresent")),
        ("command", strs(&["sh", "/etc/busbw/run.sh"])),
        (
            "env",
            list(vec![
                value_env("JOB_PREFIX", &cx.name),
                value_env("THRESHOLD", &a.threshold),
                value_env("WAIT_SECONDS", "7200"),
            ]),
        ),
        (
            "volumeMounts",
            list(vec![
                map(vec![("name", s("results")), ("mountPath", s("/results"))]),
                map(vec![("name", s("config")), ("mountPath", s("/etc/busbw"))]),
            ]),
        ),
    ]);
    let cron = map(vec![
        ("apiVersion", s("batch/v1")),
        ("kind", s("CronJob")),
        ("metadata", metadata(cx, &cx.name, true, vec![])),
        (
            "spec",
            map(vec![
                ("schedule", s(&a.schedule)),
                ("concurrencyPolicy", s("Forbid")),
                ("startingDeadlineSeconds", int(3600)),
                ("successfulJobsHistoryLimit", int(7)),
                ("failedJobsHistoryLimit", int(7)),
                (
                    "jobTemplate",
                    map(vec![(
                        "spec",
                        map(vec![
                            ("backoffLimit", int(0)),
                            ("activeDeadlineSeconds", int(9000)),
                            (
                                "template",
                                map(vec![
                                    (
                                        "metadata",
                                        map(vec![(
                                            "labels",
                                            map(vec![("app.kubernetes.io/name", s("busbw"))]),
                                        )]),
                                    ),
                                    (
                                        "spec",
                                        map(vec![
                                            ("serviceAccountName", s(RUNNER)),
                                            ("restartPolicy", s("Never")),
                                            ("containers", list(vec![runner])),
                                            (
                                                "volumes",
                                                list(vec![
                                                    map(vec![
                                                        ("name", s("results")),
                                                        (
                                                            "persistentVolumeClaim",
                                                            map(vec![("claimName", s(&pvc))]),
                                                        ),
                                                    ]),
                                                    map(vec![
                                                        ("name", s("config")),
                                                        (
                                                            "configMap",
                                                            map(vec![("name", s(RUNNER))]),
                                                        ),
                                                    ]),
                                                ]),
                                            ),
                                        ]),
                                    ),
                                ]),
                            ),
                        ]),
                    )]),
                ),
            ]),
        ),
    ]);
    vec![
        claim,
        account,
        role,
        binding(cx, "RoleBinding", RUNNER, RUNNER),
        config,
        cron,
    ]
}

/// The nightly runner: create the gang job, wait for it, compare with the last good
/// baseline, keep the new run as the baseline when it passed. Exit codes are busbw's.
const RUNNER_SCRIPT: &str = r#"set -eu
run=$(date -u +%Y%m%d-%H%M%S)
job="$JOB_PREFIX-$run"
mkdir -p /results/runs
sed "s/@RUN@/$run/g" /etc/busbw/job.yaml | kubectl create -f -
deadline=$(( $(date +%s) + WAIT_SECONDS ))
while :; do
  phase=$(kubectl get jobs.batch.volcano.sh "$job" -o 'jsonpath={.status.state.phase}' 2>/dev/null || true)
  case "$phase" in
    Completed) break ;;
    Failed|Aborted|Terminated)
      echo "busbw nightly: job $job ended $phase (see kubectl logs $job-rank-0)" >&2
      exit 3 ;;
  esac
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "busbw nightly: job $job not done after $WAIT_SECONDS s (phase '$phase'); deleting it" >&2
    kubectl delete jobs.batch.volcano.sh "$job" --wait=false || true
    exit 4
  fi
  sleep 15
done
new="/results/runs/$run.json"
if [ ! -s "$new" ]; then
  echo "busbw nightly: job $job completed but wrote no $new" >&2
  exit 1
fi
if [ -s /results/baseline.json ]; then
  rc=0
  busbw compare /results/baseline.json "$new" --threshold "$THRESHOLD" --markdown "/results/runs/$run.compare.md" || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "busbw nightly: $new regressed against the last good baseline (exit $rc); baseline kept" >&2
    exit "$rc"
  fi
else
  echo "busbw nightly: first run, $new becomes the baseline"
fi
cp "$new" /results/.baseline.json.tmp
mv /results/.baseline.json.tmp /results/baseline.json
busbw history /results/runs --plot /results/history.svg || true
"#;
