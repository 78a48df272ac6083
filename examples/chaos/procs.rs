//! The processes of a chaos run, all on 127.0.0.1 and all started (and stopped, by pid) by
//! the harness: a private Postgres, a private Redis, anvil with the project's token, the
//! project's x402 test upstream, and the routers.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use x402_router_testkit::proc::{Proc, Ready};
use x402_router_testkit::{free_port, wait_port};

/// anvil's public development keys (never anywhere real): #0 deploys and settles, #1 is the
/// router's wallet, #2 receives the payments.
pub const FACILITATOR_KEY: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
pub const ROUTER_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
pub const ROUTER_ADDRESS: &str = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";
pub const PAY_TO: &str = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC";
pub const CHAIN_ID: u64 = 84532;

fn is_root() -> bool {
    std::process::Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A private Postgres server (data under the run's directory).
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

impl Postgres {
    pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        let as_postgres = is_root();
        let data = dir.join("pg");
        if as_postgres {
            // initdb refuses root: the server runs as the postgres user.
            let ok = std::process::Command::new("chown").arg("-R").arg("postgres").arg(dir).status()?.success();
            anyhow::ensure!(ok, "chown of the run directory to postgres failed");
        }
        let pg = Self { bin: bin.to_owned(), data, port: free_port()?, as_postgres };
        let out = pg.command("initdb").arg("-D").arg(&pg.data).args(["-U", "postgres", "--auth=trust"]).output()?;
        anyhow::ensure!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off",
            pg.port,
            pg.data.display()
        );
        let out = pg
            .command("pg_ctl")
            .arg("-D")
            .arg(&pg.data)
            .arg("-l")
            .arg(pg.data.join("server.log"))
            .args(["-w", "-o", &opts, "start"])
            .output()?;
        anyhow::ensure!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
        Ok(pg)
    }

    fn command(&self, tool: &str) -> std::process::Command {
        let path = self.bin.join(tool);
        if self.as_postgres {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            std::process::Command::new(path)
        }
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// `pg_ctl restart -m fast|immediate` (immediate: crash recovery at the next start).
    pub async fn restart(&self, mode: &'static str) -> anyhow::Result<()> {
        let mut cmd = self.command("pg_ctl");
        cmd.arg("-D").arg(&self.data).args(["-w", "-m", mode, "restart"]).stdout(Stdio::null()).stderr(Stdio::null());
        let status = tokio::task::spawn_blocking(move || cmd.status()).await??;
        anyhow::ensure!(status.success(), "pg_ctl restart -m {mode} failed");
        Ok(())
    }

    pub fn stop(&self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A private redis-server (nothing on disk), restartable on its port.
pub struct Redis {
    bin: String,
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub async fn start(bin: &str) -> anyhow::Result<Self> {
        let mut r = Self { bin: bin.to_owned(), port: free_port()?, child: None };
        r.spawn().await?;
        Ok(r)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let child = Command::new(&self.bin)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", self.bin))?;
        self.child = Some(child);
        Ok(wait_port(self.port, Duration::from_secs(10)).await?)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn flushall(&self) -> anyhow::Result<()> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("FLUSHALL").query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// kill -9 and start again on the same port (everything cached is gone).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
        self.spawn().await
    }
}

/// anvil, the project's token (deployed by the test upstream's `deploy`) and the upstream.
pub struct Chain {
    pub rpc_port: u16,
    pub token: String,
    pub upstream_port: u16,
    _anvil: Child,
    _upstream: Child,
}

impl Chain {
    pub async fn start(anvil: &str, upstream_bin: &Path, log: &Path) -> anyhow::Result<Self> {
        let rpc_port = free_port()?;
        let anvil = Command::new(anvil)
            .args(["--port", &rpc_port.to_string(), "--host", "127.0.0.1", "--chain-id", &CHAIN_ID.to_string()])
            .arg("--silent")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {anvil}"))?;
        wait_port(rpc_port, Duration::from_secs(20)).await?;
        let rpc = format!("http://127.0.0.1:{rpc_port}");
        let deploy = Command::new(upstream_bin)
            .args(["deploy", "--rpc-url", &rpc, "--deployer-key", FACILITATOR_KEY])
            .arg("--mint")
            .arg(format!("{ROUTER_ADDRESS}=1000000000000"))
            .output()
            .await?;
        anyhow::ensure!(deploy.status.success(), "deploy: {}", String::from_utf8_lossy(&deploy.stderr));
        let line: Value = serde_json::from_slice(&deploy.stdout)?;
        let token = line["token"].as_str().context("deploy printed no token")?.to_owned();
        let mut upstream = Command::new(upstream_bin)
            .args(["serve", "--bind", "127.0.0.1:0", "--rpc-url", &rpc, "--token", &token])
            .args(["--pay-to", PAY_TO, "--facilitator-key", FACILITATOR_KEY, "--price", "10000"])
            .args(["--settle-timeout-seconds", "20"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .kill_on_drop(true)
            .spawn()?;
        let stdout = upstream.stdout.take().context("upstream stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await??.context("no line")?;
        let listening: Value = serde_json::from_str(&first)?;
        let addr = listening["listening"].as_str().context("no listening address")?;
        let upstream_port = addr.rsplit(':').next().context("port")?.parse()?;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { rpc_port, token, upstream_port, _anvil: anvil, _upstream: upstream })
    }

    pub fn rpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.rpc_port)
    }
}

/// One router process; restartable on its port.
pub struct Router {
    pub port: u16,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Proc>,
    pub stopped: bool,
    /// Starts that exited before listening (and were started again).
    pub restarts_at_startup: u64,
}

impl Router {
    pub async fn start(bin: &Path, args: Vec<String>, log: PathBuf) -> anyhow::Result<Self> {
        let mut r = Self {
            port: free_port()?,
            bin: bin.to_owned(),
            args,
            log,
            child: None,
            stopped: false,
            restarts_at_startup: 0,
        };
        r.spawn().await?;
        Ok(r)
    }

    /// Starts the process, supervising it like an orchestrator would: a router that exits
    /// during start-up (its Postgres restarting, a connection dropped mid-migration) is
    /// started again until it listens (at most 60 s).
    async fn spawn(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
            let mut child = Proc::spawn(
                Command::new(&self.bin)
                    .arg("serve")
                    .args(&self.args)
                    .args(["--bind", &format!("127.0.0.1:{}", self.port)])
                    .env_clear()
                    .env("RUST_LOG", "warn,x402_router::startup=info,x402_router::commands=info")
                    .stdout(Stdio::null())
                    .stderr(log),
            )?;
            self.stopped = false;
            let port = self.port;
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = child
                .wait_ready(left, &format!("the router on port {port}"), || async move {
                    tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
                })
                .await;
            match ready {
                Ok(Ready::Up(())) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Ok(Ready::Exited) => self.restarts_at_startup += 1,
                Err(e) => {
                    self.child = Some(child);
                    bail!("{e}");
                }
            }
            if Instant::now() > deadline {
                bail!("router on port {} kept exiting at start-up", self.port);
            }
            // lets time pass: an orchestrator's back-off before starting a crashed process
            // again (its Postgres may still be restarting; there is no event to wait for).
            x402_router_testkit::wait::let_time_pass(Duration::from_millis(300)).await;
        }
    }

    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// kill -9, then start again.
    pub async fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        if let Some(mut c) = self.child.take() {
            c.kill().await;
        }
        self.spawn().await
    }

    pub fn signal(&mut self, sig: &str) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.signal(sig);
            self.stopped = sig == "STOP";
        }
    }

    pub async fn shutdown(&mut self) {
        if self.stopped {
            self.signal("CONT");
        }
        if let Some(mut c) = self.child.take() {
            c.kill().await;
        }
    }
}
