//! Credentials as EKS gives them, on the bare control plane: the controller process gets the
//! environment and token file EKS's pod identity webhook (IRSA) or EKS Pod Identity would give
//! its pod — the token minted with the TokenRequest API for the chart's ServiceAccount — and a
//! mock-ec2 of its own whose stand-in STS / EKS Auth verify that token against this API server's
//! keys and hand out short-lived credentials, and whose EC2 verifies every call's signature.
//! The credentials expire several times while nodes join: the SDK must refresh them without a
//! restart, a refused call or a missed label.
//!
//! Local only (they replace the shared controller for their duration, then restore it).

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use e2e::{
    cluster::{NAMESPACE, SERVICE_ACCOUNT},
    credentials::{
        self, BY_POD_IDENTITY, BY_WEB_IDENTITY, POD_IDENTITY_AUDIENCE, ROLE_ARN, STS_AUDIENCE,
    },
    env::{Env, WAIT, expected_of, restart_labeler_with, start_labeler_with_env, wait_leader},
    fixtures::NodeSpec,
    kube_util::{self, eventually, wait_for_topology},
    labeler::{Labeler, metric_sum},
    mock::{MockAdmin, MockProcess},
    process::{Proc, free_port},
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client, api::PostParams};
use mock_ec2::{AuthConfig, Scenario};
use serde_json::json;

/// Lifetime of the handed-out credentials: the SDK refreshes them 5 to 10 s before expiry, so a
/// 20 s session is replaced every 10 to 15 s.
const SESSION: Duration = Duration::from_secs(20);
/// How long nodes keep joining: past two expiries and three credentials at least.
const JOINING: Duration = Duration::from_secs(45);
/// A wave of new nodes this often.
const WAVE: Duration = Duration::from_secs(5);

/// The mock of these scenarios, its controller, and (Pod Identity) the agent.
struct Stage {
    mock: MockProcess,
    labeler: Labeler,
    _agent: Option<Proc>,
    dir: PathBuf,
}

/// How the controller gets its credentials.
enum Source {
    /// `AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`, exchanged at STS (`AWS_ENDPOINT_URL_STS`).
    Irsa,
    /// `AWS_CONTAINER_CREDENTIALS_FULL_URI` + `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`, from the
    /// agent (here on loopback: the SDK allows plain HTTP to loopback and to the EKS agent's
    /// link-local address).
    PodIdentity,
}

/// Stop the shared controller, start the stage's mock (verifying signatures, trusting the
/// controller's ServiceAccount) and a controller given `source` as EKS gives it.
async fn stage(env: &Env, name: &str, source: Source, auth: AuthConfig) -> anyhow::Result<Stage> {
    let cp = env
        .cluster
        .local
        .as_ref()
        .context("a local control plane")?;
    let dir = env.dir.join(name);
    std::fs::create_dir_all(&dir)?;
    let admin_kc = cp.admin_kubeconfig.to_string_lossy().to_string();
    // The mock reads the cluster's signing keys through the API server, as any client would.
    let mock = MockProcess::start_with_env(
        &dir.join("mock"),
        &Scenario::default(),
        &[("KUBECONFIG", admin_kc.as_str())],
    )
    .await?;
    mock.admin.set_auth(&auth).await?;
    let c = env.admin().await?;
    let (audience, token_file) = match source {
        Source::Irsa => (STS_AUDIENCE, dir.join("token")),
        Source::PodIdentity => (
            POD_IDENTITY_AUDIENCE,
            dir.join(credentials::POD_IDENTITY_TOKEN_FILE),
        ),
    };
    let token = credentials::mint_token(&c, NAMESPACE, SERVICE_ACCOUNT, audience).await?;
    std::fs::write(&token_file, token)?;
    let token_file = token_file.to_string_lossy().to_string();
    let mut agent = None;
    let mut vars: Vec<(String, String)> = vec![
        // The region EKS's webhook injects next to the credentials.
        ("AWS_REGION".into(), "us-west-2".into()),
        ("AWS_DEFAULT_REGION".into(), "us-west-2".into()),
        ("AWS_STS_REGIONAL_ENDPOINTS".into(), "regional".into()),
    ];
    match source {
        Source::Irsa => {
            vars.push(("AWS_ROLE_ARN".into(), ROLE_ARN.into()));
            vars.push(("AWS_WEB_IDENTITY_TOKEN_FILE".into(), token_file));
            vars.push(("AWS_ENDPOINT_URL_STS".into(), mock.url().to_string()));
        }
        Source::PodIdentity => {
            let port = free_port()?;
            let mut cmd = Command::new(e2e::bin_dir().join("mock-ec2"));
            cmd.args([
                "pod-identity-agent",
                &format!("--listen=127.0.0.1:{port}"),
                &format!("--eks-auth-url={}", mock.url()),
                "--cluster-name=e2e",
            ]);
            agent = Some(Proc::spawn(
                "pod-identity-agent",
                cmd,
                &dir.join("agent.log"),
            )?);
            let uri = format!("http://127.0.0.1:{port}/v1/credentials");
            let probe = MockAdmin::new(&format!("http://127.0.0.1:{port}"));
            eventually("the agent listening", Duration::from_secs(10), || async {
                Ok(probe
                    .raw("/v1/credentials", None, &[])
                    .await
                    .is_ok()
                    .then_some(()))
            })
            .await?;
            vars.push(("AWS_CONTAINER_CREDENTIALS_FULL_URI".into(), uri));
            vars.push(("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE".into(), token_file));
        }
    }
    let kc = env
        .cluster
        .controller_kubeconfig
        .clone()
        .context("a local control plane")?;
    if let Some(mut shared) = env.labeler.lock().await.take() {
        shared.stop();
    }
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut labeler = start_labeler_with_env(&kc, mock.url(), &dir, name, &[], &vars)?;
    labeler.wait_ready(Duration::from_secs(30)).await?;
    wait_leader(&labeler, true).await?;
    Ok(Stage {
        mock,
        labeler,
        _agent: agent,
        dir,
    })
}

impl Stage {
    /// Stop this stage's controller and bring the shared one back, leading.
    async fn finish(mut self, env: &Env, nodes: &[NodeSpec]) -> anyhow::Result<()> {
        self.labeler.stop();
        let c = env.admin().await?;
        for n in nodes {
            kube_util::delete_node(&c, &n.name).await?;
        }
        restart_labeler_with(env, &[]).await?;
        eprintln!("    stage logs in {}", self.dir.display());
        Ok(())
    }
}

/// Nodes join in waves for [`JOINING`] while the credentials expire every [`SESSION`]; each is
/// labelled within [`WAIT`] of joining. Returns every node that joined.
async fn nodes_join_while_credentials_rotate(
    c: &Client,
    mock: &MockAdmin,
    prefix: u32,
) -> anyhow::Result<Vec<NodeSpec>> {
    let started = Instant::now();
    let mut joined = Vec::new();
    let mut n = 0;
    while started.elapsed() < JOINING {
        let wave_started = Instant::now();
        let wave: Vec<NodeSpec> = (0..2)
            .map(|_| {
                n += 1;
                NodeSpec::ec2(prefix, n, "p5.48xlarge")
            })
            .collect();
        let leaf = format!("nn-creds-leaf-{n}");
        let instances: Vec<_> = wave
            .iter()
            .map(|s| s.instance(&["nn-creds-spine", "nn-creds-agg", leaf.as_str()]))
            .collect();
        mock.upsert_all(&instances).await?;
        kube_util::create_nodes(c, wave.iter().map(NodeSpec::node).collect()).await?;
        for (s, i) in wave.iter().zip(&instances) {
            wait_for_topology(c, &s.name, &expected_of(i), WAIT)
                .await
                .with_context(|| {
                    format!(
                        "{} joined {:.0}s into the run",
                        s.name,
                        started.elapsed().as_secs_f64()
                    )
                })?;
        }
        joined.extend(wave);
        tokio::time::sleep(WAVE.saturating_sub(wave_started.elapsed())).await;
    }
    // Nothing lost on the way: every node still carries its labels.
    for s in &joined {
        let labels = kube_util::topology_labels(&kube_util::labels(c, &s.name).await?);
        ensure!(
            labels.len() == 4,
            "{} lost labels after joining: {labels:?}",
            s.name
        );
    }
    Ok(joined)
}

/// What a rotation run must show, whichever the source.
async fn rotation(env: &Env, name: &str, source: Source, issued_by: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let auth = credentials::auth_config(SESSION.as_secs());
    let mut stage = stage(env, name, source, auth).await?;
    let pid = stage.labeler.pid();
    let c = env.admin().await?;
    let prefix = if issued_by == BY_WEB_IDENTITY {
        0x3c1
    } else {
        0x3c2
    };
    let result = async {
        let joined = nodes_join_while_credentials_rotate(&c, &stage.mock.admin, prefix).await?;
        // Past three expiries: at least three credentials signed calls, every one handed out by
        // `issued_by` to the controller's ServiceAccount, none refused (expired, unknown or
        // badly signed).
        let signed = credentials::check_signed_by(&stage.mock.admin, issued_by, 3).await?;
        let creds = stage.mock.admin.credentials().await?;
        let outcomes = if issued_by == BY_WEB_IDENTITY {
            &creds.web_identity
        } else {
            &creds.pod_identity
        };
        ensure!(
            outcomes.keys().all(|k| k == "ok"),
            "{issued_by} refused the controller's token: {outcomes:?}"
        );
        ensure!(
            stage.labeler.alive() && stage.labeler.pid() == pid,
            "the controller restarted"
        );
        let m = stage.labeler.metrics().await?;
        let failed = metric_sum(&m, "ec2_topology_labeler_ec2_calls_total", &[])
            - metric_sum(&m, "ec2_topology_labeler_ec2_calls_total", &["outcome=\"ok\""]);
        ensure!(failed == 0.0, "{failed} EC2 calls did not succeed");
        eprintln!(
            "    {name}: {} nodes labelled over {:.0}s; {} EC2 calls signed with {} keys ({} handed out), 0 refused, 0 restarts",
            joined.len(),
            JOINING.as_secs_f64(),
            signed.calls,
            signed.keys,
            signed.issued
        );
        anyhow::Ok(joined)
    }
    .await;
    let joined = match &result {
        Ok(j) => j.clone(),
        Err(_) => Vec::new(),
    };
    let log = stage.labeler.log_tail(30);
    stage.finish(env, &joined).await?;
    eprintln!("    {name} took {:.1}s", started.elapsed().as_secs_f64());
    result
        .map(drop)
        .with_context(|| format!("controller log:\n{log}"))
}

/// IRSA: the token (audience `sts.amazonaws.com`) exchanged at the stand-in STS, which checks
/// it against the API server's keys; credentials rotate while nodes join.
pub async fn irsa_credentials_rotate_while_nodes_join(env: &Env) -> anyhow::Result<()> {
    rotation(env, "creds-irsa", Source::Irsa, BY_WEB_IDENTITY).await
}

/// EKS Pod Identity: the token (audience `pods.eks.amazonaws.com`) sent to the agent, which has
/// EKS Auth verify it; credentials rotate while nodes join.
pub async fn pod_identity_credentials_rotate_while_nodes_join(env: &Env) -> anyhow::Result<()> {
    rotation(
        env,
        "creds-pod-identity",
        Source::PodIdentity,
        BY_POD_IDENTITY,
    )
    .await
}

/// Credentials that expire under the running controller: EC2 answers `RequestExpired` until the
/// controller renews them (EC2 called them expired), then labels the node that joined meanwhile,
/// without a restart. Then the stand-ins
/// refuse as AWS documents: STS a token for another audience or with a forged signature
/// (`InvalidIdentityToken`), one whose ServiceAccount the role does not trust (`AccessDenied`),
/// an injected refusal (`ExpiredTokenException`); the agent, for EKS Auth, a token without
/// association (`ResourceNotFoundException`, 404), one for STS's audience
/// (`InvalidTokenException`), none at all.
pub async fn expired_and_refused_credentials_are_answered_as_aws_does(
    env: &Env,
) -> anyhow::Result<()> {
    // Long enough that the controller's credential is still fresh in its eyes when the mock
    // expires it.
    let auth = credentials::auth_config(30);
    let mut stage = stage(env, "creds-refused", Source::Irsa, auth.clone()).await?;
    let c = env.admin().await?;
    let mock = stage.mock.admin.clone();
    let result = async {
        // A first node: the controller holds a credential from now on.
        let a = NodeSpec::ec2(0x3c3, 1, "p5.48xlarge");
        let b = NodeSpec::ec2(0x3c3, 2, "p5.48xlarge");
        let ia = a.instance(&["nn-creds-spine", "nn-creds-agg", "nn-creds-a"]);
        let ib = b.instance(&["nn-creds-spine", "nn-creds-agg", "nn-creds-b"]);
        mock.upsert_all(&[ia.clone(), ib.clone()]).await?;
        kube_util::create_nodes(&c, vec![a.node()]).await?;
        wait_for_topology(&c, &a.name, &expected_of(&ia), WAIT).await?;
        mock.expire_credentials().await?;
        mock.reset_stats().await?;
        let expired_at = Instant::now();
        kube_util::create_nodes(&c, vec![b.node()]).await?;
        wait_for_topology(&c, &b.name, &expected_of(&ib), Duration::from_secs(30) + WAIT).await?;
        let stats = mock.stats().await?;
        let refused = stats.auth_refused.get("RequestExpired").copied().unwrap_or(0);
        ensure!(
            refused > 0,
            "EC2 never answered RequestExpired: {:?}",
            stats.auth_refused
        );
        ensure!(stage.labeler.alive(), "the controller exited");
        eprintln!(
            "    expired credentials: {refused} calls refused RequestExpired, the node labelled {:.1}s after the expiry",
            expired_at.elapsed().as_secs_f64()
        );
        refusals(&c, &mock, &auth, &stage.dir).await?;
        anyhow::Ok(vec![a, b])
    }
    .await;
    let joined = result.as_ref().map(Clone::clone).unwrap_or_default();
    let log = stage.labeler.log_tail(30);
    stage.finish(env, &joined).await?;
    result
        .map(drop)
        .with_context(|| format!("controller log:\n{log}"))
}

/// The stand-ins' refusals, asked directly.
async fn refusals(
    c: &Client,
    mock: &MockAdmin,
    auth: &AuthConfig,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let untrusted = "creds-untrusted";
    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), NAMESPACE);
    if sas.get_opt(untrusted).await?.is_none() {
        sas.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": untrusted}}))?,
        )
        .await?;
    }
    let sts = |token: String| {
        let mock = mock.clone();
        async move {
            let form = format!(
                "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn={ROLE_ARN}&RoleSessionName=e2e&WebIdentityToken={token}"
            );
            let (status, _, body) = mock
                .raw("/", Some(("application/x-www-form-urlencoded", form)), &[])
                .await?;
            let code = body
                .split("<Code>")
                .nth(1)
                .and_then(|s| s.split("</Code>").next())
                .unwrap_or("ok")
                .to_string();
            anyhow::Ok((status.as_u16(), code))
        }
    };
    let good = credentials::mint_token(c, NAMESPACE, SERVICE_ACCOUNT, STS_AUDIENCE).await?;
    let got = sts(good.clone()).await?;
    ensure!(
        got == (200, "ok".into()),
        "the controller's own token: {got:?}"
    );
    let other_audience =
        credentials::mint_token(c, NAMESPACE, SERVICE_ACCOUNT, POD_IDENTITY_AUDIENCE).await?;
    let got = sts(other_audience.clone()).await?;
    ensure!(
        got == (400, "InvalidIdentityToken".into()),
        "another audience: {got:?}"
    );
    let mut forged = good.clone();
    let last = forged.pop().context("empty token")?;
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let got = sts(forged).await?;
    ensure!(
        got == (400, "InvalidIdentityToken".into()),
        "a forged signature: {got:?}"
    );
    let stranger = credentials::mint_token(c, NAMESPACE, untrusted, STS_AUDIENCE).await?;
    let got = sts(stranger).await?;
    ensure!(
        got == (403, "AccessDenied".into()),
        "an untrusted ServiceAccount: {got:?}"
    );
    mock.set_auth(&AuthConfig {
        refuse_assume_role: Some("ExpiredTokenException".into()),
        ..auth.clone()
    })
    .await?;
    let got = sts(good.clone()).await?;
    mock.set_auth(auth).await?;
    ensure!(
        got == (400, "ExpiredTokenException".into()),
        "injected: {got:?}"
    );

    // EKS Auth, through the agent.
    let port = free_port()?;
    let mut cmd = Command::new(e2e::bin_dir().join("mock-ec2"));
    cmd.args([
        "pod-identity-agent",
        &format!("--listen=127.0.0.1:{port}"),
        &format!("--eks-auth-url={}", mock.url),
        "--cluster-name=e2e",
    ]);
    let _agent = Proc::spawn("pod-identity-agent", cmd, &dir.join("agent.log"))?;
    let agent = MockAdmin::new(&format!("http://127.0.0.1:{port}"));
    eventually("the agent listening", Duration::from_secs(10), || async {
        Ok(agent
            .raw("/v1/credentials", None, &[])
            .await
            .is_ok()
            .then_some(()))
    })
    .await?;
    let ask = |token: String| {
        let agent = agent.clone();
        async move {
            let (status, _, body) = agent
                .raw(
                    "/v1/credentials",
                    None,
                    &[("authorization", token.as_str())],
                )
                .await?;
            anyhow::Ok((status.as_u16(), body))
        }
    };
    let (status, body) = ask(other_audience).await?;
    ensure!(
        status == 200 && body.contains("\"AccessKeyId\":\"ASIA"),
        "the controller's Pod Identity token: {status} {body}"
    );
    let stranger = credentials::mint_token(c, NAMESPACE, untrusted, POD_IDENTITY_AUDIENCE).await?;
    let (status, body) = ask(stranger).await?;
    ensure!(
        status == 404 && body.contains("ResourceNotFoundException"),
        "no association: {status} {body}"
    );
    let (status, body) = ask(good).await?;
    ensure!(
        status == 400 && body.contains("InvalidTokenException"),
        "STS's audience: {status} {body}"
    );
    let (status, body) = ask(String::new()).await?;
    ensure!(
        status == 400 && body.contains("cannot be empty"),
        "no token: {status} {body}"
    );
    Ok(())
}
