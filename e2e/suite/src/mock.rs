//! mock-ec2 as a process, and a client for its admin API (the same client drives the in-cluster
//! mock on kind).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client as HttpClient, rt::TokioExecutor};
use mock_ec2::{AuthConfig, CredentialStats, Faults, Instance, Scenario, Stats};

use crate::process::{Proc, free_port};

/// The admin API of a running mock-ec2.
#[derive(Clone)]
pub struct MockAdmin {
    pub url: String,
    http: HttpClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl MockAdmin {
    pub fn new(url: &str) -> Self {
        Self {
            url: url.trim_end_matches('/').to_string(),
            http: HttpClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Bytes> {
        let req = http::Request::builder()
            .method(method.clone())
            .uri(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = self
            .http
            .request(req)
            .await
            .with_context(|| format!("{method} {path} on mock-ec2"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        if !status.is_success() {
            bail!(
                "{method} {path} on mock-ec2: {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        Ok(bytes)
    }

    /// One `DescribeInstanceTopology` for `ids`, as any client sends it; returns the HTTP status
    /// (503 when throttled).
    pub async fn describe_topology(&self, ids: &[&str]) -> anyhow::Result<http::StatusCode> {
        let mut form = String::from("Action=DescribeInstanceTopology&Version=2016-11-15");
        for (k, id) in ids.iter().enumerate() {
            form.push_str(&format!("&InstanceId.{}={id}", k + 1));
        }
        let req = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("{}/", self.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from(form)))?;
        let resp = self.http.request(req).await?;
        let status = resp.status();
        resp.into_body().collect().await?;
        Ok(status)
    }

    /// GET `path` as text (also used for other plain-HTTP endpoints: metrics, probes).
    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let bytes = self.call(http::Method::GET, path, None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    pub async fn stats(&self) -> anyhow::Result<Stats> {
        Ok(serde_json::from_slice(
            &self.call(http::Method::GET, "/_admin/stats", None).await?,
        )?)
    }

    pub async fn reset_stats(&self) -> anyhow::Result<()> {
        self.call(http::Method::POST, "/_admin/stats/reset", None)
            .await
            .map(drop)
    }

    pub async fn set_faults(&self, faults: &Faults) -> anyhow::Result<()> {
        self.call(
            http::Method::PUT,
            "/_admin/faults",
            Some(serde_json::to_vec(faults)?),
        )
        .await
        .map(drop)
    }

    /// What the mock accepts: signature verification, keys, roles, Pod Identity associations.
    pub async fn set_auth(&self, auth: &AuthConfig) -> anyhow::Result<()> {
        self.call(
            http::Method::PUT,
            "/_admin/auth",
            Some(serde_json::to_vec(auth)?),
        )
        .await
        .map(drop)
    }

    /// The credentials the stand-in STS and EKS Auth handed out, and their answers.
    pub async fn credentials(&self) -> anyhow::Result<CredentialStats> {
        Ok(serde_json::from_slice(
            &self
                .call(http::Method::GET, "/_admin/credentials", None)
                .await?,
        )?)
    }

    /// Every credential handed out so far expires now.
    pub async fn expire_credentials(&self) -> anyhow::Result<()> {
        self.call(http::Method::POST, "/_admin/credentials/expire", None)
            .await
            .map(drop)
    }

    /// POST `body` (with `content_type`) to `path`, or GET when `body` is `None`, with extra
    /// headers, as any client would call it; returns the status, the headers and the body.
    pub async fn raw(
        &self,
        path: &str,
        body: Option<(&str, String)>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(http::StatusCode, http::HeaderMap, String)> {
        let mut req = http::Request::builder()
            .method(if body.is_some() {
                http::Method::POST
            } else {
                http::Method::GET
            })
            .uri(format!("{}{path}", self.url));
        if let Some((content_type, _)) = &body {
            req = req.header("content-type", *content_type);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::from(
            body.map(|(_, b)| b).unwrap_or_default(),
        )))?;
        let resp = self.http.request(req).await?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await?.to_bytes();
        Ok((
            parts.status,
            parts.headers,
            String::from_utf8_lossy(&bytes).into_owned(),
        ))
    }

    pub async fn upsert(&self, instance: &Instance) -> anyhow::Result<()> {
        let path = format!("/_admin/instances/{}", instance.instance_id);
        self.call(
            http::Method::PUT,
            &path,
            Some(serde_json::to_vec(instance)?),
        )
        .await
        .map(drop)
    }

    pub async fn upsert_all(&self, instances: &[Instance]) -> anyhow::Result<()> {
        let mut scenario = self.scenario().await?;
        for i in instances {
            scenario
                .instances
                .retain(|x| x.instance_id != i.instance_id);
            scenario.instances.push(i.clone());
        }
        self.call(
            http::Method::PUT,
            "/_admin/instances",
            Some(serde_json::to_vec(&scenario)?),
        )
        .await
        .map(drop)
    }

    /// The scenario as the mock holds it, changed by `change` and put back.
    async fn change_scenario(&self, change: impl FnOnce(&mut Scenario)) -> anyhow::Result<()> {
        let mut scenario = self.scenario().await?;
        change(&mut scenario);
        self.call(
            http::Method::PUT,
            "/_admin/instances",
            Some(serde_json::to_vec(&scenario)?),
        )
        .await
        .map(drop)
    }

    /// The Capacity Reservations the mock describes, replaced (its instances kept).
    pub async fn set_reservations(
        &self,
        reservations: &[mock_ec2::reservations::CapacityReservation],
    ) -> anyhow::Result<()> {
        self.change_scenario(|s| s.reservations = reservations.to_vec())
            .await
    }

    pub async fn reservation_stats(
        &self,
    ) -> anyhow::Result<mock_ec2::reservations::ReservationStats> {
        Ok(serde_json::from_slice(
            &self
                .call(http::Method::GET, "/_admin/stats/reservations", None)
                .await?,
        )?)
    }

    /// The Capacity Blocks the mock describes, replaced (its instances and reservations kept).
    pub async fn set_capacity_blocks(
        &self,
        blocks: &[mock_ec2::capacity_blocks::CapacityBlock],
    ) -> anyhow::Result<()> {
        self.change_scenario(|s| s.capacity_blocks = blocks.to_vec())
            .await
    }

    /// One Capacity Block's interconnect: `ok`, `impaired` or `insufficient-data`.
    pub async fn set_interconnect(
        &self,
        capacity_block_id: &str,
        status: &str,
    ) -> anyhow::Result<()> {
        let path = format!("/_admin/capacity-blocks/{capacity_block_id}/interconnect");
        self.call(http::Method::PUT, &path, Some(status.as_bytes().to_vec()))
            .await
            .map(drop)
    }

    pub async fn capacity_block_stats(
        &self,
    ) -> anyhow::Result<mock_ec2::capacity_blocks::CapacityBlockStats> {
        Ok(serde_json::from_slice(
            &self
                .call(http::Method::GET, "/_admin/stats/capacity-blocks", None)
                .await?,
        )?)
    }

    pub async fn scenario(&self) -> anyhow::Result<Scenario> {
        Ok(serde_json::from_slice(
            &self
                .call(http::Method::GET, "/_admin/instances", None)
                .await?,
        )?)
    }
}

/// mock-ec2 running as a process on a fixed loopback port (so it can be stopped and started
/// again at the same address, as EC2 going down and coming back).
pub struct MockProcess {
    pub admin: MockAdmin,
    pub port: u16,
    dir: PathBuf,
    env: Vec<(String, String)>,
    proc: Option<Proc>,
}

impl MockProcess {
    pub async fn start(dir: &Path, scenario: &Scenario) -> anyhow::Result<Self> {
        Self::start_with_env(dir, scenario, &[]).await
    }

    /// [`MockProcess::start`] with extra environment (`KUBECONFIG`: the cluster whose
    /// service-account tokens its STS and EKS Auth verify).
    pub async fn start_with_env(
        dir: &Path,
        scenario: &Scenario,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let port = free_port()?;
        let mut m = Self {
            admin: MockAdmin::new(&format!("http://127.0.0.1:{port}")),
            port,
            dir: dir.to_path_buf(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            proc: None,
        };
        m.launch(scenario).await?;
        Ok(m)
    }

    pub fn url(&self) -> &str {
        &self.admin.url
    }

    async fn launch(&mut self, scenario: &Scenario) -> anyhow::Result<()> {
        let file = self.dir.join("scenario.json");
        std::fs::write(&file, serde_json::to_vec_pretty(scenario)?)?;
        let mut cmd = Command::new(crate::bin_dir().join("mock-ec2"));
        cmd.arg(format!("--listen=127.0.0.1:{}", self.port))
            .arg(format!("--scenario={}", file.display()))
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        self.proc = Some(Proc::spawn(
            "mock-ec2",
            cmd,
            &self.dir.join("mock-ec2.log"),
        )?);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.admin.stats().await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "mock-ec2 did not start; see {}",
            self.dir.join("mock-ec2.log").display()
        )
    }

    /// EC2 goes away: connections are refused until [`MockProcess::up`].
    pub async fn down(&mut self) -> anyhow::Result<Scenario> {
        let scenario = self.admin.scenario().await?;
        if let Some(mut p) = self.proc.take() {
            p.stop(Duration::from_secs(5));
        }
        Ok(scenario)
    }

    /// EC2 comes back at the same address with `scenario`.
    pub async fn up(&mut self, scenario: &Scenario) -> anyhow::Result<()> {
        self.launch(scenario).await
    }
}
