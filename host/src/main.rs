//! The `stateward` command: the operator and its offline tools.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand, ValueEnum};
use stateward::runtime::{AllocatorKind, Limits, Plugin, Registry, Sandbox};

/// mimalloc: policy decisions and the JSON of every plan are allocation-bound, and it cut a
/// guardrails decision by about a tenth against the system allocator (host/benches/policy_eval).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "stateward", version, about = "Kubernetes operator for stateful services, with Wasm plugins and Rego policy")]
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
}

impl SandboxArgs {
    fn sandbox(&self) -> anyhow::Result<Arc<Sandbox>> {
        let limits = Limits {
            budget: Duration::from_millis(self.plugin_timeout_ms),
            memory_bytes: self.plugin_memory_mib << 20,
            output_bytes: self.plugin_output_mib << 20,
            ..Limits::default()
        };
        Ok(Sandbox::new(limits, self.allocator, self.wasm_cache.clone())?)
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
    /// Watch only this namespace (needs only a namespaced Role); all namespaces by default.
    #[arg(long, env = "STATEWARD_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz, /readyz and /debug/*.
    #[arg(long, default_value = "0.0.0.0:8080")]
    http_addr: std::net::SocketAddr,
    /// Directory of the policy bundle (*.rego and *.json data).
    #[arg(long, env = "STATEWARD_POLICY_DIR", default_value = "policies")]
    policy_dir: PathBuf,
    /// Append-only audit log file; standard output when not set.
    #[arg(long, env = "STATEWARD_AUDIT_LOG")]
    audit_log: Option<PathBuf>,
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
    /// Check an audit log's hash chain; reports the first broken line.
    Verify { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        Command::Plugin(PluginCommand::Pack { file, name, namespace, sandbox }) => pack(&sandbox, &file, name, &namespace),
        Command::Policy(PolicyCommand::Test { dir }) => {
            Ok(exit(stateward::policy::cli::test(&dir)?))
        }
        Command::Policy(PolicyCommand::Eval { input, path, dir }) => {
            let value = stateward::policy::cli::eval(&dir, &input, &path)?;
            println!("{}", serde_json::to_string_pretty(&value)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Audit(AuditCommand::Verify { file }) => {
            Ok(exit(stateward::policy::cli::verify_audit(&file)?))
        }
    }
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
    let sandbox = args.sandbox.sandbox()?;
    let registry = Registry::load_dir(&sandbox, &args.sandbox.plugin_dir)
        .with_context(|| format!("loading plugins from {}", args.sandbox.plugin_dir.display()))?;
    let shipped_bundle = stateward::policy::Bundle::from_dir(&args.policy_dir)
        .with_context(|| format!("reading policies from {}", args.policy_dir.display()))?;
    let sink = match &args.audit_log {
        Some(path) => AuditSink::File(path.clone()),
        None => AuditSink::Stdout,
    };
    let gate = policy_gate(&args.policy_dir, &sink)?;
    for plugin in registry.plugins() {
        let verdict = gate.plugin_load(
            &stateward::policy::DecisionContext::default(),
            &stateward::reload::plugins::load_input(&plugin),
        );
        if !verdict.allowed() {
            bail!("built-in plugin {} is denied by the plugins policy: {}", plugin.name(), verdict.denied.join("; "));
        }
    }
    let registry = Arc::new(stateward::runtime::LiveRegistry::new(registry));
    let gate = Arc::new(stateward::policy::LiveGate::new(gate));
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let mut leader = stateward::leader::LeaderConfig::new(&args.lease_namespace, "stateward-leader", identity);
    leader.lease_duration = Duration::from_secs(args.lease_seconds.max(3));
    leader.renew_deadline = leader.lease_duration * 2 / 3;
    leader.retry_period = leader.lease_duration / 7;
    let settings = stateward::controller::Settings {
        namespace: args.namespace.clone(),
        http_addr: args.http_addr,
        leader,
        concurrency: args.concurrency.max(1),
        sweep_interval: Duration::from_secs(args.sweep_interval.max(1)),
        shipped_bundle,
    };
    let webhook = args.webhook.enabled().then(|| {
        (args.webhook.settings(&args.lease_namespace, args.namespace.as_deref()), args.webhook.webhook_addr)
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let client = kube::Client::try_default().await.context("connecting to the API server")?;
        // Every replica serves the webhooks (the API server may call any of them).
        if let Some((webhook_settings, addr)) = webhook {
            let state = stateward::webhook::Webhook {
                registry: Arc::clone(&registry),
                sandbox: Arc::clone(&sandbox),
                gate: Arc::clone(&gate),
                client: client.clone(),
            };
            let listener = stateward::webhook::bind(addr).await?;
            // The webhook's CA issues the managed clusters' certificates too (labelled
            // ensure-secret): the built-in one, or the CA cert-manager keeps for the operator.
            let ca_secret = if webhook_settings.cert_manager {
                stateward::webhook::certmanager::CA_CERTIFICATE.to_string()
            } else {
                webhook_settings.secret.clone()
            };
            let keeper = stateward::webhook::service_certs::CertificateKeeper {
                client: client.clone(),
                namespace: webhook_settings.watch_namespace.clone(),
                ca_secret: (webhook_settings.namespace.clone(), ca_secret),
                cert_manager: webhook_settings.cert_manager,
                policy: webhook_settings.policy.clone(),
            };
            tokio::spawn(keeper.run());
            let client = client.clone();
            tokio::spawn(async move {
                if let Err(e) = stateward::webhook::run(client, listener, Arc::new(state), webhook_settings, std::future::pending()).await {
                    tracing::error!(error = %e, "webhook server stopped");
                }
            });
        }
        stateward::controller::run(client, sandbox, registry, gate, settings).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn render(args: RenderArgs) -> anyhow::Result<ExitCode> {
    use stateward::render;
    let read = |p: &PathBuf| {
        std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
    };
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
    let now_ms = args.now_ms.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    });
    let registry = args.sandbox.registry()?;
    let resource = resources.remove(0);
    let rendered = if args.no_policy {
        render::render(&registry, resource, &children, now_ms)?
    } else {
        // Offline decisions are not part of the operator's audit trail.
        let gate = policy_gate(&args.policy_dir, &stateward::policy::AuditSink::File("/dev/null".into()))?;
        render::render_checked(&registry, &gate, resource, &children, now_ms)?
    };
    let denied = rendered.policy.as_ref().is_some_and(|p| !p.allowed);
    let text = match args.output {
        Output::Yaml => render::to_yaml(&rendered)?,
        Output::Json => serde_json::to_string_pretty(&rendered)? + "\n",
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(exit(!denied))
}

/// The policy bundle in `dir`, compiled with its tests run, deciding into `audit`.
fn policy_gate(dir: &std::path::Path, audit: &stateward::policy::AuditSink) -> anyhow::Result<stateward::policy::Gate> {
    use stateward::policy::{AuditLog, Bundle, FsyncPolicy, Gate, PolicyEngine};
    let bundle = Bundle::from_dir(dir).with_context(|| format!("reading policies from {}", dir.display()))?;
    let engine = PolicyEngine::compile_tested(&bundle).context("compiling the policy bundle")?;
    let fsync = match audit {
        stateward::policy::AuditSink::File(path) if path != std::path::Path::new("/dev/null") => FsyncPolicy::PerRecord,
        _ => FsyncPolicy::OsBuffered,
    };
    let audit = AuditLog::open(audit, fsync).context("opening the audit log")?;
    Ok(Gate::new(Arc::new(engine), Arc::new(audit)))
}

fn pack(args: &SandboxArgs, file: &std::path::Path, name: Option<String>, namespace: &str) -> anyhow::Result<ExitCode> {
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    // Load it first: a file the operator would refuse is better refused here.
    let plugin = stateward::runtime::Plugin::load(&args.sandbox()?, &bytes)
        .with_context(|| format!("{} is not a loadable plugin", file.display()))?;
    let name = name.unwrap_or_else(|| plugin.name().to_string());
    if name != plugin.name() {
        bail!("the component calls itself {:?}; --name {name:?} would be rejected by the operator", plugin.name());
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
    for plugin in registry.plugins() {
        for kind in &plugin.info().kinds {
            let yaml = yaml_serde::to_string(&stateward::crd::render(kind))?;
            match &out_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir)?;
                    let path = dir.join(stateward::crd::file_name(kind));
                    std::fs::write(&path, &yaml)
                        .with_context(|| format!("writing {}", path.display()))?;
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
    let owns: Vec<String> = info
        .owns
        .iter()
        .map(|c| format!("{} {}", c.api_version, c.kind))
        .collect();
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
    #[arg(long, default_value = "90d", value_parser = stateward::webhook::parse_duration)]
    cert_lifetime: Duration,
    /// Renew the serving certificate when less than this remains.
    #[arg(long, default_value = "30d", value_parser = stateward::webhook::parse_duration)]
    cert_renew_before: Duration,
    /// Lifetime of the built-in CA.
    #[arg(long, default_value = "3650d", value_parser = stateward::webhook::parse_duration)]
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
            tracing::info!("webhooks off: outside a cluster they need --webhook-url (e.g. https://127.0.0.1:9443)");
        }
        !self.no_webhook && !implicit_off
    }

    fn settings(&self, lease_namespace: &str, watch_namespace: Option<&str>) -> stateward::webhook::Settings {
        use stateward::webhook::{CertPolicy, Endpoint, Settings};
        let namespace = self.webhook_namespace.clone().unwrap_or_else(|| lease_namespace.to_string());
        let endpoint = match &self.webhook_url {
            Some(url) => Endpoint::Url(url.clone()),
            None => Endpoint::Service { namespace: namespace.clone(), name: self.webhook_service.clone() },
        };
        Settings {
            endpoint,
            namespace,
            secret: self.webhook_secret.clone(),
            configuration: self.webhook_configuration.clone(),
            watch_namespace: watch_namespace.map(str::to_string),
            configure: self.webhook_configure,
            cert_manager: self.cert_manager,
            policy: CertPolicy { cert_lifetime: self.cert_lifetime, renew_before: self.cert_renew_before, ca_lifetime: self.ca_lifetime },
        }
    }
}
