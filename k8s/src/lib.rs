//! `busbw k8s render`: the Kubernetes manifests of a busbw gang job (Volcano, Kueue JobSet,
//! MPI Operator), its RBAC and the nightly CronJob, as YAML (or JSON). The files under k8s/
//! are this crate's output with the options named in their first line; a test renders them
//! again and compares, so the two cannot drift apart. It lives beside what it renders, and
//! the binary only prints what [`render`] returns.

mod manifests;
pub mod yaml;

use clap::{Args, Subcommand, ValueEnum};

#[derive(Args, Debug, Clone)]
pub struct K8sArgs {
    #[command(subcommand)]
    pub command: K8sCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum K8sCommand {
    /// Print the manifests of a gang job (and its RBAC) for ad-hoc `kubectl apply -f -`.
    Render(Box<RenderArgs>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scheduler {
    /// Volcano Job with the env and svc plugins (or the pytorch plugin with --pytorch).
    Volcano,
    /// JobSet queued by Kueue (queue-name label, topology-aware scheduling annotations).
    Kueue,
    /// Kubeflow MPI Operator MPIJob v2beta1 (mpirun over ssh).
    Mpi,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Part {
    /// RBAC and the job (with --label-nodes also the labeler's RBAC).
    All,
    /// ServiceAccount, the node-reader ClusterRole and its binding.
    Rbac,
    /// The opt-in ClusterRole that may patch nodes (for --label-nodes) and its binding.
    LabelerRbac,
    /// The job alone (with --nightly: the CronJob and what it needs).
    Job,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopologyMode {
    Hard,
    Soft,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Yaml,
    Json,
}

/// What to render. Defaults give the committed bases under k8s/.
#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  busbw k8s render --scheduler volcano --nodes 16 --gpus-per-node 8 | kubectl apply -f -\n  \
busbw k8s render --scheduler kueue --nodes 4 --queue gpu --topology-level oci.oraclecloud.com/rdma.network_block_id\n  \
busbw k8s render --scheduler volcano --nodes 8 --label-nodes busbw.dev/fabric-ok=true\n  \
busbw k8s render --scheduler volcano --nodes 8 --nightly --report-pvc busbw-results --push-gateway http://pushgateway.monitoring:9091\n\n\
Arguments after -- replace the default sweep (-b 1M -e 1G -f 2) of the busbw command in the pods."
)]
pub struct RenderArgs {
    /// Which gang scheduler runs the job.
    #[arg(long = "scheduler", value_enum)]
    pub scheduler: Scheduler,
    /// Pods (one per node).
    #[arg(long = "nodes", default_value_t = 2)]
    pub nodes: usize,
    /// Ranks per pod (one per GPU); BUSBW_NPROC_PER_NODE in the pods.
    #[arg(long = "gpus-per-node", default_value_t = 8)]
    pub gpus_per_node: usize,
    /// Container image [default: busbw:latest; busbw:mpi for --scheduler mpi].
    #[arg(long = "image")]
    pub image: Option<String>,
    /// Image of the nightly runner (busbw, kubectl and a shell).
    #[arg(long = "runner-image", default_value = "busbw:runner")]
    pub runner_image: String,
    /// Job name [default: busbw-gate; busbw-nightly with --nightly].
    #[arg(long = "name")]
    pub name: Option<String>,
    /// Namespace of the namespaced objects [default: none, kubectl's current one; the
    /// ClusterRoleBindings name `default`].
    #[arg(long = "namespace")]
    pub namespace: Option<String>,
    /// Volcano queue, or Kueue LocalQueue (the kueue.x-k8s.io/queue-name label).
    #[arg(long = "queue", default_value = "default")]
    pub queue: String,
    /// Volcano: use the pytorch plugin (tasks master + worker; RANK, WORLD_SIZE, MASTER_ADDR)
    /// instead of env + svc.
    #[arg(long = "pytorch")]
    pub pytorch: bool,
    /// hostNetwork pods (dnsPolicy ClusterFirstWithHostNet): the node's interfaces, as RDMA
    /// over RoCE without SR-IOV needs.
    #[arg(long = "host-network")]
    pub host_network: bool,
    /// Volcano networkTopology mode: all pods under one HyperNode (hard) or best effort (soft).
    #[arg(long = "network-topology", value_enum)]
    pub network_topology: Option<TopologyMode>,
    /// Volcano networkTopology highestTierAllowed.
    #[arg(long = "highest-tier", requires = "network_topology")]
    pub highest_tier: Option<u32>,
    /// Kueue: node label of the topology level the whole job must fit in
    /// (kueue.x-k8s.io/podset-required-topology).
    #[arg(long = "topology-level")]
    pub topology_level: Option<String>,
    /// Kueue: make --topology-level a preference (podset-preferred-topology).
    #[arg(long = "topology-preferred", requires = "topology_level")]
    pub topology_preferred: bool,
    /// `busbw tiers --topology-preset` in the pods.
    #[arg(long = "topology-preset", default_value = "auto")]
    pub topology_preset: String,
    /// `busbw tiers --topology-source` in the pods (k8s reads this node's labels from the API
    /// server, which the node-reader RBAC allows).
    #[arg(long = "topology-source", default_value = "k8s")]
    pub topology_source: String,
    /// Claim the node's GPUs (nvidia.com/gpu: --gpus-per-node) instead of leaving it a comment.
    #[arg(long = "request-gpus")]
    pub request_gpus: bool,
    /// Extended resource for RDMA devices, NAME=COUNT (rdma/hca_shared_devices_a=1,
    /// nvidia.com/rdma-vf=16); a comment when not given.
    #[arg(long = "rdma-resource", value_name = "NAME=COUNT")]
    pub rdma_resource: Option<String>,
    /// Rendezvous port (with --host-network it must be free on every node).
    #[arg(long = "port", default_value_t = 29500)]
    pub port: u16,
    /// Mount this PersistentVolumeClaim at /results and write the report there (--export-json);
    /// without it the report is rank 0's log (stdout).
    #[arg(long = "report-pvc", value_name = "CLAIM")]
    pub report_pvc: Option<String>,
    /// Pushgateway the run's metrics go to (--push-gateway of the busbw command).
    #[arg(long = "push-gateway", value_name = "URL")]
    pub push_gateway: Option<String>,
    /// The gate before training: label the nodes that passed KEY=VALUE, unlabel the ones the
    /// verdict names (busbw tiers --label-nodes; adds the labeler RBAC).
    #[arg(long = "label-nodes", value_name = "KEY=VALUE")]
    pub label_nodes: Option<String>,
    /// The nightly: a CronJob that creates the gang job, keeps results on --report-pvc,
    /// compares with the last good baseline and pushes metrics (Volcano only).
    #[arg(long = "nightly")]
    pub nightly: bool,
    /// CronJob schedule of --nightly.
    #[arg(long = "schedule", default_value = "0 2 * * *")]
    pub schedule: String,
    /// `busbw compare --threshold` of --nightly.
    #[arg(long = "threshold", default_value = "5%")]
    pub threshold: String,
    /// Size of the results claim --nightly creates.
    #[arg(long = "results-size", default_value = "10Gi")]
    pub results_size: String,
    /// Which objects to print.
    #[arg(long = "part", value_enum, default_value = "all")]
    pub part: Part,
    /// Output format (json: one array of objects, comments dropped).
    #[arg(long = "output", short = 'o', value_enum, default_value = "yaml")]
    pub output: Format,
    /// busbw flags replacing the default sweep (after --).
    #[arg(last = true)]
    pub busbw_args: Vec<String>,
}

/// The text `busbw k8s render` prints for `r`: YAML documents opened by the command line
/// (`argv`, the whole of it) that renders them again, or one JSON array. `Err` is a usage
/// error in words.
pub fn render(r: &RenderArgs, argv: &[String]) -> Result<String, String> {
    let docs = manifests::render(r)?;
    Ok(match r.output {
        Format::Yaml => yaml::documents(&header(argv), &docs),
        Format::Json => {
            let v: Vec<_> = docs.iter().map(yaml::Y::to_json).collect();
            let mut t = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
            t.push('\n');
            t
        }
    })
}

/// The comment that opens the YAML: the command that printed it, so a reader (and the test
/// that keeps k8s/ in step) can render it again.
fn header(argv: &[String]) -> Vec<String> {
    let at = argv.iter().position(|a| a == "render").map_or(0, |i| i + 1);
    let mut words = vec!["busbw".to_string(), "k8s".into(), "render".into()];
    words.extend(argv[at..].iter().map(|w| shell_word(w)));
    vec![
        format!("Generated by: {}", words.join(" ")),
        "Edit the options (or k8s/src), not this file: a test renders it again.".into(),
    ]
}

/// `w` as one POSIX shell word.
pub fn shell_word(w: &str) -> String {
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,%@+".contains(c))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}
