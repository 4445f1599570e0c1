//! The `stateward` command: the operator and its offline tools.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use stateward::runtime::{AllocatorKind, Compiler, Limits, Plugin, Registry, Sandbox};

/// mimalloc: policy decisions and the JSON of every plan are allocation-bound, and it cut a
/// guardrails decision by about a tenth against the system allocator (host/benches/policy_eval).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "stateward",
    version,
    about = "Kubernetes operator for stateful services, with Wasm plugins and Rego policy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the operator against the cluster of the current kubeconfig (or in-cluster config).
    Run(RunArgs),
    /// Print the plan a plugin makes for a resource, offline.
    Render(RenderArgs),
    /// Render the CustomResourceDefinitions the plugins declare.
    Crds {
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Write one file per CRD into this directory instead of printing.
        #[arg(long)]
        out_dir: Option<PathBuf>,
    },
    /// Plugin tools.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Policy tools.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Audit log tools.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Phase, conditions, roles and lag, policy decisions and last Events of a resource.
    Status(TargetArgs),
    /// Switch the primary over to POD, a member of the resource (PostgreSQL, Redis).
    Promote {
        #[command(flatten)]
        target: TargetArgs,
        /// The pod to promote.
        pod: String,
    },
    /// Stop every change to a resource (`spec.paused`) until `resume`.
    Pause(TargetArgs),
    /// Apply changes to a paused resource again.
    Resume(TargetArgs),
    /// Restart a resource's members one at a time, in the service's safe order.
    Restart(TargetArgs),
    /// Stop every pod of a resource (`spec.hibernate`), keeping its volumes and Secrets.
    Hibernate(TargetArgs),
    /// Start a hibernating resource's pods again, on the same volumes.
    Wake(TargetArgs),
    /// Take PODs of a resource out of every client Service, keeping them for inspection.
    Fence {
        #[command(flatten)]
        target: TargetArgs,
        /// The pods to fence.
        #[arg(required = true)]
        pods: Vec<String>,
    },
    /// Put fenced PODs (all of them when none is named) back into the Services.
    Unfence {
        #[command(flatten)]
        target: TargetArgs,
        /// The pods to unfence.
        pods: Vec<String>,
    },
}

/// A resource of one of the operator's kinds in the cluster of the current kubeconfig.
#[derive(Args)]
struct TargetArgs {
    /// The resource's name.
    name: String,
    /// Its namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Its kind (kind, plural or singular name), when a name is used by more than one kind.
    #[arg(long)]
    kind: Option<String>,
}

#[derive(Args)]
struct SandboxArgs {
    /// Directory of built-in plugin `.wasm` files.
    #[arg(long, env = "STATEWARD_PLUGIN_DIR", default_value = "target/plugins")]
    plugin_dir: PathBuf,
    /// Where precompiled plugins are cached between starts.
    #[arg(long, env = "STATEWARD_WASM_CACHE")]
    wasm_cache: Option<PathBuf>,
    /// Wall-clock budget of one plugin call.
    #[arg(long, default_value = "2000", value_name = "MS")]
    plugin_timeout_ms: u64,
    /// Memory cap of one plugin call.
    #[arg(long, default_value = "64", value_name = "MIB")]
    plugin_memory_mib: usize,
    /// Cap on what one plugin call may return.
    #[arg(long, default_value = "4", value_name = "MIB")]
    plugin_output_mib: usize,
    #[arg(long, value_enum, default_value = "auto")]
    allocator: AllocatorKind,
    /// Compiler of plugin code: winch compiles about six times faster (a hot-loaded build
    /// serves sooner), cranelift makes faster code; auto is winch on x86-64.
    #[arg(long, value_enum, env = "STATEWARD_PLUGIN_COMPILER", default_value = "auto")]
    plugin_compiler: Compiler,
}

impl SandboxArgs {
    fn sandbox(&self) -> anyhow::Result<Arc<Sandbox>> {
        let limits = Limits {
            budget: Duration::from_millis(self.plugin_timeout_ms),
            memory_bytes: self.plugin_memory_mib << 20,
            output_bytes: self.plugin_output_mib << 20,
            ..Limits::default()
        };
        Ok(Sandbox::with_compiler(limits, self.allocator, self.plugin_compiler, self.wasm_cache.clone())?)
    }

    fn registry(&self) -> anyhow::Result<Registry> {
        let sandbox = self.sandbox()?;
        Registry::load_dir(&sandbox, &self.plugin_dir).with_context(|| {
            format!(
                "loading plugins from {} (build them with scripts/build-plugins)",
                self.plugin_dir.display()
            )
        })
    }
}

#[derive(Args)]
struct RunArgs {
    /// Watch only these namespaces (comma-separated or repeated; a Role in each, nothing
    /// cluster-wide); all namespaces by default.
    #[arg(long, env = "STATEWARD_NAMESPACE", value_delimiter = ',')]
    namespace: Vec<String>,
    /// Address of /metrics, /healthz, /readyz and /debug/*.
    #[arg(long, default_value = "0.0.0.0:8080")]
    http_addr: std::net::SocketAddr,
    /// Directory of the policy bundle (*.rego and *.json data).
    #[arg(long, env = "STATEWARD_POLICY_DIR", default_value = "policies")]
    policy_dir: PathBuf,
    /// Append-only audit log file; standard output when not set.
    #[arg(long, env = "STATEWARD_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
    /// Rotate the audit log file to `<file>.<last seq>` at this size; the next segment
    /// continues the chain.
    #[arg(long, default_value = "67108864")]
    audit_segment_bytes: u64,
    /// Ed25519 key (base64 PKCS#8, `stateward audit keygen`) that signs periodic checkpoints of
    /// the audit chain's head; none are taken without it.
    #[arg(long, env = "STATEWARD_AUDIT_SIGNING_KEY")]
    audit_signing_key: Option<PathBuf>,
    /// Seconds between audit checkpoints (one more at shutdown).
    #[arg(long, default_value = "60")]
    audit_checkpoint_interval: u64,
    /// Seconds between the records that count a converged resource's unchanged decisions
    /// (each is written in full once, then counted; also written on losing leadership and at
    /// shutdown).
    #[arg(long, default_value = "60")]
    audit_repeat_interval: u64,
    /// Namespace of the leader-election Lease (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// This replica's identity in the Lease (the pod name in a cluster).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds a Lease is valid without renewal.
    #[arg(long, default_value = "15")]
    lease_seconds: u64,
    /// Reconciles at once per kind.
    #[arg(long, default_value = "8")]
    concurrency: u16,
    /// Plain text logs instead of JSON lines.
    #[arg(long)]
    plain_logs: bool,
    /// Seconds between audit sweeps (existing resources against the admission policy).
    #[arg(long, default_value = "300")]
    sweep_interval: u64,
    /// Hardened profile: a plugin build from a ConfigMap loads only if its digest is pinned
    /// (`--pin-plugin`, or `digests`/`pins` in the policy directory's data).
    #[arg(long)]
    require_plugin_pins: bool,
    /// Admits one build: NAME=sha256:<hex> (repeatable; `stateward plugin pack` prints the
    /// digest in its annotation). Part of the policy floor, like --policy-dir.
    #[arg(long = "pin-plugin", value_name = "NAME=DIGEST")]
    pin_plugin: Vec<String>,
    /// The SHA-256 the policy directory's data.json must have (the Helm chart pins the document
    /// it installs): on any other the operator does not start.
    #[arg(long, value_name = "HEX")]
    policy_data_sha256: Option<String>,
    #[command(flatten)]
    sandbox: SandboxArgs,
    #[command(flatten)]
    webhook: WebhookArgs,
}

#[derive(Args)]
struct RenderArgs {
    /// The custom resource (YAML or JSON).
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Observed children (YAML documents), as if read from the cluster.
    #[arg(long)]
    children: Option<PathBuf>,
    /// Recorded answers to the plugin's requests (a JSON or YAML list of responses:
    /// id, code, stdout, stderr, error…), as if the live service had given them.
    #[arg(long)]
    responses: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "yaml")]
    output: Output,
    /// Milliseconds since the epoch handed to the plugin as `now` (default: the clock).
    #[arg(long)]
    now_ms: Option<u64>,
    /// Policy bundle whose guardrails judge the plan.
    #[arg(long, env = "STATEWARD_POLICY_DIR", default_value = "policies")]
    policy_dir: PathBuf,
    /// Skip the guardrails verdict.
    #[arg(long)]
    no_policy: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Yaml,
    Json,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Name, version, kinds, digest, size, imports and exports of a `.wasm`.
    Inspect {
        file: PathBuf,
        #[command(flatten)]
        sandbox: SandboxArgs,
    },
    /// Print the ConfigMap YAML that hot-loads FILE into a running operator.
    Pack {
        file: PathBuf,
        /// Plugin name (default: the component's own, from `info()`).
        #[arg(long)]
        name: Option<String>,
        /// The operator's namespace.
        #[arg(long, default_value = "stateward-system")]
        namespace: String,
        #[command(flatten)]
        sandbox: SandboxArgs,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run the `test_*` rules of every `*_test.rego` in DIR.
    Test {
        #[arg(default_value = "policies")]
        dir: PathBuf,
    },
    /// Evaluate a query against the bundle in --dir with an input document.
    Eval {
        #[arg(long)]
        input: PathBuf,
        #[arg(long, default_value = "data.stateward.guardrails.deny")]
        path: String,
        #[arg(long, default_value = "policies")]
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Check audit log segments: each one's hash chain (the first broken line), that they
    /// follow each other per chain, and the signed checkpoints (a truncated or rewritten log).
    Verify {
        /// Segment files, in any order (a live file and its rotated `<file>.<seq>` segments).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Files of signed checkpoints (the operator's `<audit-log>.checkpoints`, or its log
        /// lines carrying `audit_checkpoint`).
        #[arg(long)]
        checkpoints: Vec<PathBuf>,
        /// The public key the checkpoints are signed with (base64, as `audit keygen` prints).
        #[arg(long)]
        public_key: Option<PathBuf>,
    },
    /// Make a checkpoint signing key: the private key (base64 PKCS#8, for a Secret) goes to
    /// FILE with mode 0600, the public key (base64) to standard output.
    Keygen {
        #[arg(long)]
        private_key: PathBuf,
    },
}

fn main() -> ExitCode {
    // Installed as `kubectl-stateward`, the binary is kubectl's plugin and says so in its help.
    let invoked = std::env::args_os().next().map(PathBuf::from);
    let as_kubectl_plugin =
        invoked.as_deref().and_then(|p| p.file_name()).is_some_and(|n| n == "kubectl-stateward");
    let command = Cli::command();
    let command = if as_kubectl_plugin {
        command.name("kubectl stateward").bin_name("kubectl stateward")
    } else {
        command
    };
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match &cli.command {
        Command::Run(args) => stateward::telemetry::logging::init(!args.plain_logs),
        _ => stateward::telemetry::logging::init(false),
    }
    let code = match dispatch(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    };
    // Sends the spans still queued for OTLP export (a no-op when export is off).
    stateward::telemetry::logging::shutdown();
    code
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => operate(args),
        Command::Render(args) => render(args),
        Command::Crds { sandbox, out_dir } => crds(&sandbox, out_dir),
        Command::Plugin(PluginCommand::Inspect { file, sandbox }) => inspect(&sandbox, &file),
        Command::Plugin(PluginCommand::Pack { file, name, namespace, sandbox }) => {
            pack(&sandbox, &file, name, &namespace)
        }
        Command::Policy(PolicyCommand::Test { dir }) => Ok(exit(stateward::policy::cli::test(&dir)?)),
        Command::Policy(PolicyCommand::Eval { input, path, dir }) => {
            let value = stateward::policy::cli::eval(&dir, &input, &path)?;
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit(AuditCommand::Verify { files, checkpoints, public_key }) => {
            if let ([file], []) = (files.as_slice(), checkpoints.as_slice()) {
                return Ok(exit(stateward::policy::cli::verify_audit(file)?));
            }
            Ok(exit(stateward::policy::cli::verify_segments(&files, &checkpoints, public_key.as_deref())?))
        }
        Command::Audit(AuditCommand::Keygen { private_key }) => {
            let public = stateward::policy::cli::keygen(&private_key)?;
            println!("{public}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Status(t) => {
            on_target(t, |client, target| async move { stateward::kubectl::status(&client, &target).await })
        }
        Command::Promote { target, pod } => on_target(target, |client, target| async move {
            stateward::kubectl::promote(&client, &target, &pod).await
        }),
        Command::Pause(t) => {
            on_target(t, |_, target| async move { stateward::kubectl::set_paused(&target, true).await })
        }
        Command::Resume(t) => {
            on_target(t, |_, target| async move { stateward::kubectl::set_paused(&target, false).await })
        }
        Command::Hibernate(t) => {
            on_target(t, |_, target| async move { stateward::kubectl::set_hibernate(&target, true).await })
        }
        Command::Wake(t) => {
            on_target(t, |_, target| async move { stateward::kubectl::set_hibernate(&target, false).await })
        }
        Command::Fence { target, pods } => on_target(target, |client, target| async move {
            stateward::kubectl::fence(&client, &target, &pods).await
        }),
        Command::Unfence { target, pods } => {
            on_target(target, |_, target| async move { stateward::kubectl::unfence(&target, &pods).await })
        }
        Command::Restart(t) => on_target(t, |_, target| async move {
            stateward::kubectl::restart(
                &target,
                &jiff::Timestamp::now().round(jiff::Unit::Second)?.to_string(),
            )
            .await
        }),
    }
}

/// Runs a verb on the resource `args` names, in the cluster of the current kubeconfig, and
/// prints what it says.
fn on_target<F, Fut>(args: TargetArgs, verb: F) -> anyhow::Result<ExitCode>
where
    F: FnOnce(kube::Client, stateward::kubectl::Target) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let said = runtime.block_on(async {
        let config = kube::Config::infer().await.context("reading the kubeconfig")?;
        let namespace = args.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config)?;
        let target = stateward::kubectl::find(&client, &namespace, &args.name, args.kind.as_deref()).await?;
        verb(client, target).await
    })?;
    println!("{}", said.trim_end());
    Ok(ExitCode::SUCCESS)
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn operate(args: RunArgs) -> anyhow::Result<ExitCode> {
    use stateward::policy::AuditSink;
    let watched = stateward::watched::Watched::from_names(&args.namespace).map_err(anyhow::Error::msg)?;
    if let Some(pinned) = &args.policy_data_sha256 {
        stateward::policy::floor::check_data_pin(&args.policy_dir, pinned).map_err(anyhow::Error::msg)?;
    }
    let sandbox = args.sandbox.sandbox()?;
    let registry = Registry::load_dir(&sandbox, &args.sandbox.plugin_dir)
        .with_context(|| format!("loading plugins from {}", args.sandbox.plugin_dir.display()))?;
    let sink = match &args.audit_log {
        Some(path) => AuditSink::File(path.clone()),
        None => AuditSink::Stdout,
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
    let identity = args.identity.clone().unwrap_or_else(|| format!("{host}-{}", std::process::id()));
    // The chain is this replica's (its pod name, or the host's name, which a restart keeps);
    // on standard output, which cannot be read back to continue from, each process's chain is
    // its own.
    let chain = match &sink {
        AuditSink::File(_) => args.identity.clone().unwrap_or(host),
        AuditSink::Stdout => format!("{identity}@{}", jiff::Timestamp::now()),
    };
    let audit_settings = stateward::policy::AuditSettings {
        fsync: stateward::policy::FsyncPolicy::PerRecord,
        chain,
        max_segment_bytes: Some(args.audit_segment_bytes.max(4096)),
    };
    let profile = stateward::policy::floor::profile(args.require_plugin_pins, &args.pin_plugin)
        .map_err(anyhow::Error::msg)?;
    let (gate, audit) = policy_gate(&args.policy_dir, profile, &sink, audit_settings)?;
    let checkpoints = match &args.audit_signing_key {
        Some(key) => Some(stateward::policy::cli::Checkpoints::start(
            audit,
            key,
            args.audit_log.as_ref().map(|p| stateward::policy::cli::checkpoint_file(p)),
            Duration::from_secs(args.audit_checkpoint_interval.max(1)),
        )?),
        None => None,
    };
    for plugin in registry.plugins() {
        let verdict = gate.plugin_load(
            &stateward::policy::DecisionContext::in_current_span(String::new()),
            &stateward::policy_input::PluginLoad::of(&plugin, stateward::policy_input::PluginLoad::BUILTIN),
        );
        if !verdict.allowed() {
            bail!(
                "built-in plugin {} is denied by the plugins policy: {}",
                plugin.name(),
                verdict.denied.join("; ")
            );
        }
    }
    let registry = Arc::new(stateward::runtime::LiveRegistry::new(registry));
    let gate = Arc::new(stateward::policy::LiveGate::new(gate));
    let mut leader =
        stateward::leader::LeaderConfig::new(&args.lease_namespace, "stateward-leader", identity);
    leader.lease_duration = Duration::from_secs(args.lease_seconds.max(3));
    leader.renew_deadline = leader.lease_duration * 2 / 3;
    leader.retry_period = leader.lease_duration / 7;
    let webhook = args
        .webhook
        .enabled()
        .then(|| (args.webhook.settings(&args.lease_namespace, &watched), args.webhook.webhook_addr));
    let settings = stateward::operator::OperatorSettings {
        watched,
        http_addr: args.http_addr,
        leader,
        concurrency: args.concurrency.max(1),
        sweep_interval: Duration::from_secs(args.sweep_interval.max(1)),
        webhook,
        audit_repeat_interval: Duration::from_secs(args.audit_repeat_interval.max(1)),
    };
    // One registry for the process: served on the HTTP port, recorded into by the controllers
    // and the webhooks alike.
    let metrics = stateward::telemetry::Metrics::new();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let client = kube::Client::try_default().await.context("connecting to the API server")?;
        stateward::operator::run(client, sandbox, registry, gate, metrics, settings).await?;
        anyhow::Ok(())
    })?;
    // The head at shutdown is signed too, so the last records are covered.
    if let Some(checkpoints) = checkpoints {
        checkpoints.stop();
    }
    Ok(ExitCode::SUCCESS)
}

fn render(args: RenderArgs) -> anyhow::Result<ExitCode> {
    use stateward::render;
    let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
    let mut resources = render::parse_documents(&read(&args.file)?, "resource file")?;
    if resources.len() != 1 {
        bail!(
            "{} holds {} documents; render takes exactly one resource",
            args.file.display(),
            resources.len()
        );
    }
    let children = match &args.children {
        Some(p) => render::parse_documents(&read(p)?, "children file")?,
        None => Vec::new(),
    };
    let responses: Vec<stateward::runtime::Response> = match &args.responses {
        Some(p) => yaml_serde::from_str(&read(p)?).with_context(|| {
            format!("{}: not a list of responses (id, code, stdout, stderr, error…)", p.display())
        })?,
        None => Vec::new(),
    };
    let now_ms = args.now_ms.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    });
    let registry = args.sandbox.registry()?;
    let resource = resources.remove(0);
    let rendered = if args.no_policy {
        render::render(&registry, resource, &children, &responses, now_ms)?
    } else {
        // Offline decisions are not part of the operator's audit trail.
        let (gate, _) = policy_gate(
            &args.policy_dir,
            None,
            &stateward::policy::AuditSink::File("/dev/null".into()),
            stateward::policy::AuditSettings {
                fsync: stateward::policy::FsyncPolicy::OsBuffered,
                ..Default::default()
            },
        )?;
        render::render_checked(&registry, &gate, resource, &children, &responses, now_ms)?
    };
    let denied = rendered.policy.as_ref().is_some_and(|p| !p.allowed);
    let text = match args.output {
        Output::Yaml => render::to_yaml(&rendered)?,
        Output::Json => serde_json::to_string_pretty(&rendered)? + "\n",
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(exit(!denied))
}

/// The policy bundle in `dir` (plus the flags' data document, if any), compiled with its tests
/// run, deciding into `audit`: the policy floor. And the audit log, for its checkpoints.
fn policy_gate(
    dir: &std::path::Path,
    profile: Option<stateward::policy::BundleFile>,
    audit: &stateward::policy::AuditSink,
    mut settings: stateward::policy::AuditSettings,
) -> anyhow::Result<(stateward::policy::Gate, Arc<stateward::policy::AuditLog>)> {
    use stateward::policy::{AuditLog, Bundle, FsyncPolicy, Gate};
    let bundle = Bundle::from_dir(dir).with_context(|| format!("reading policies from {}", dir.display()))?;
    let engine =
        stateward::policy::floor::compile(&bundle, profile).context("compiling the policy bundle")?;
    match audit {
        stateward::policy::AuditSink::File(path) if path != std::path::Path::new("/dev/null") => {}
        _ => {
            settings.fsync = FsyncPolicy::OsBuffered;
            settings.max_segment_bytes = None;
        }
    }
    let audit = Arc::new(AuditLog::open_with(audit, settings).context("opening the audit log")?);
    Ok((Gate::new(Arc::new(engine), Arc::clone(&audit)), audit))
}

fn pack(
    args: &SandboxArgs,
    file: &std::path::Path,
    name: Option<String>,
    namespace: &str,
) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    // Load it first: a file the operator would refuse is better refused here.
    let plugin = stateward::runtime::Plugin::load(&args.sandbox()?, &bytes)
        .with_context(|| format!("{} is not a loadable plugin", file.display()))?;
    let name = name.unwrap_or_else(|| plugin.name().to_string());
    if name != plugin.name() {
        bail!(
            "the component calls itself {:?}; --name {name:?} would be rejected by the operator",
            plugin.name()
        );
    }
    let cm = stateward::reload::plugins::pack(&bytes, &name, namespace)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut text = yaml_serde::to_string(&serde_json::to_value(&cm)?)?;
    if !text.starts_with("apiVersion") {
        text = format!("apiVersion: v1\nkind: ConfigMap\n{text}");
    }
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(ExitCode::SUCCESS)
}

fn crds(args: &SandboxArgs, out_dir: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let registry = args.registry()?;
    let mut all = String::new();
    // deploy/crds convert through the webhook Service of deploy/webhook.
    let conversion =
        stateward::webhook::config::crd_conversion(&stateward::webhook::Endpoint::default(), None);
    for plugin in registry.plugins() {
        for kind in &plugin.info().kinds {
            let yaml = yaml_serde::to_string(&stateward::crd::render(kind, &conversion))?;
            match &out_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir)?;
                    let path = dir.join(stateward::crd::file_name(kind));
                    std::fs::write(&path, &yaml).with_context(|| format!("writing {}", path.display()))?;
                }
                None => {
                    all.push_str("---\n");
                    all.push_str(&yaml);
                }
            }
        }
    }
    print!("{all}");
    Ok(ExitCode::SUCCESS)
}

fn inspect(args: &SandboxArgs, file: &std::path::Path) -> anyhow::Result<ExitCode> {
    let sandbox = args.sandbox()?;
    let plugin = Plugin::load_file(&sandbox, file)?;
    let info = plugin.info();
    println!("name:     {}", info.name);
    println!("version:  {}", info.version);
    println!("contract: {}@{}", stateward::runtime::WIT_PACKAGE, plugin.contract().version());
    for kind in &info.kinds {
        let versions: Vec<String> = kind
            .versions
            .iter()
            .map(|v| format!("{}{}", v.name, if v.storage { " (storage)" } else { "" }))
            .collect();
        println!("kind:     {}.{} [{}]", kind.kind, kind.group, versions.join(", "));
    }
    println!("digest:   sha256:{}", plugin.digest());
    println!("size:     {} bytes", plugin.size());
    let owns: Vec<String> = info.owns.iter().map(|c| format!("{} {}", c.api_version, c.kind)).collect();
    println!("owns:     {}", owns.join(", "));
    println!("imports:");
    for i in plugin.imports() {
        println!("  {i}");
    }
    println!("exports:");
    for e in plugin.exports() {
        println!("  {e}");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Args)]
struct WebhookArgs {
    /// Address of the admission and conversion webhooks (TLS).
    #[arg(long, default_value = "0.0.0.0:9443")]
    webhook_addr: std::net::SocketAddr,
    /// Serve no webhooks and touch no webhook configuration (implied outside a cluster
    /// without --webhook-url).
    #[arg(long)]
    no_webhook: bool,
    /// Base URL the API server calls instead of the Service, e.g. https://127.0.0.1:9443; its
    /// host goes into the serving certificate. Outside a cluster (no KUBERNETES_SERVICE_HOST)
    /// the webhooks run only when it is given.
    #[arg(long)]
    webhook_url: Option<String>,
    /// The webhook Service (in --webhook-namespace).
    #[arg(long, default_value = "stateward-webhook")]
    webhook_service: String,
    /// Namespace of the webhook Service and Secret (default: the Lease namespace).
    #[arg(long)]
    webhook_namespace: Option<String>,
    /// Secret holding the CA and the serving certificate.
    #[arg(long, default_value = "stateward-webhook-tls")]
    webhook_secret: String,
    /// Name of the ValidatingWebhookConfiguration the operator keeps current.
    #[arg(long, default_value = "stateward")]
    webhook_configuration: String,
    /// Which configurations to keep pointed at this webhook.
    #[arg(long, value_enum, default_value = "all")]
    webhook_configure: stateward::webhook::Configure,
    /// cert-manager issues the serving certificate (Issuer/Certificate rendered by the operator).
    #[arg(long)]
    cert_manager: bool,
    /// Lifetime of a serving certificate (s, m, h or d suffix).
    #[arg(long, default_value = "90d", value_parser = parse_duration)]
    cert_lifetime: Duration,
    /// Renew the serving certificate when less than this remains.
    #[arg(long, default_value = "30d", value_parser = parse_duration)]
    cert_renew_before: Duration,
    /// Lifetime of the built-in CA.
    #[arg(long, default_value = "3650d", value_parser = parse_duration)]
    ca_lifetime: Duration,
}

impl WebhookArgs {
    /// On in a cluster unless --no-webhook. Outside a cluster only with --webhook-url: no
    /// Service leads to a local process, and an operator run from a shell (tests, the demo)
    /// must not claim the shared configurations, port 9443, or make the API server fail
    /// closed on its behalf without being asked to.
    fn enabled(&self) -> bool {
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        let implicit_off = !in_cluster && self.webhook_url.is_none();
        if implicit_off && !self.no_webhook {
            tracing::info!(
                "webhooks off: outside a cluster they need --webhook-url (e.g. https://127.0.0.1:9443)"
            );
        }
        !self.no_webhook && !implicit_off
    }

    fn settings(
        &self,
        lease_namespace: &str,
        watched: &stateward::watched::Watched,
    ) -> stateward::webhook::WebhookSettings {
        use stateward::webhook::{CertPolicy, Endpoint, WebhookSettings};
        let namespace = self.webhook_namespace.clone().unwrap_or_else(|| lease_namespace.to_string());
        let endpoint = match &self.webhook_url {
            Some(url) => Endpoint::Url(url.clone()),
            None => Endpoint::Service { namespace: namespace.clone(), name: self.webhook_service.clone() },
        };
        WebhookSettings {
            endpoint,
            namespace,
            secret: self.webhook_secret.clone(),
            configuration: self.webhook_configuration.clone(),
            watched: watched.clone(),
            configure: self.webhook_configure,
            cert_manager: self.cert_manager,
            policy: CertPolicy {
                cert_lifetime: self.cert_lifetime,
                renew_before: self.cert_renew_before,
                ca_lifetime: self.ca_lifetime,
            },
        }
    }
}

/// Parses `90d`, `12h`, `30m`, `45s` or plain seconds (flags of certificate lifetimes).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = text.find(|c: char| !c.is_ascii_digit()).map_or((text, ""), |i| text.split_at(i));
    let n: u64 =
        number.parse().map_err(|_| format!("{text:?} is not a duration like 90d, 12h, 30m or 45s"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => return Err(format!("unknown unit {unit:?} in {text:?} (s, m, h or d)")),
    };
    n.checked_mul(secs).map(Duration::from_secs).ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90d"), Ok(Duration::from_secs(90 * 86400)));
        assert_eq!(parse_duration("6s"), Ok(Duration::from_secs(6)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("d").is_err());
    }
}
