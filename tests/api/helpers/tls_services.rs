//! Servers that the deployment tests start for themselves and stop when dropped (also
//! when the test panics): a TLS-only Postgres, a TLS-only Redis and a 3-master Redis
//! Cluster, plus the certificates they use (a fresh self-signed CA per test).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// A directory under the system's temp dir, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("x4r-{tag}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A CA, a server certificate it signed (for `names`), and an unrelated CA (the "wrong CA").
pub struct TestPki {
    pub dir: TempDir,
    pub ca: PathBuf,
    pub wrong_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

impl TestPki {
    /// `names` are the server certificate's subject alternative names (IP addresses become
    /// IP SANs).
    pub fn generate(names: &[&str]) -> Self {
        let dir = TempDir::new("pki");
        let ca = new_ca("x402-router test CA");
        let wrong = new_ca("some other CA");
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, names.first().copied().unwrap_or("server"));
        let cert = params.signed_by(&key, &ca).unwrap();
        let write = |name: &str, pem: String| {
            let p = dir.0.join(name);
            std::fs::write(&p, pem).unwrap();
            p
        };
        Self {
            ca: write("ca.pem", ca.pem()),
            wrong_ca: write("wrong-ca.pem", wrong.pem()),
            server_cert: write("server.crt", cert.pem()),
            server_key: write("server.key", key.serialize_pem()),
            dir,
        }
    }
}

/// Polls `probe` until it is true or `limit` passes.
pub async fn wait_until(what: &str, limit: Duration, mut probe: impl AsyncFnMut() -> bool) {
    let mut deadline = x402_router_testkit::Deadline::after(limit, what);
    while !probe().await {
        deadline.next_poll().await.unwrap();
    }
}

async fn listening(port: u16) -> bool {
    tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
}

pub fn pg_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("PG_BIN_DIR") {
        return PathBuf::from(d);
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres server binaries (install them with scripts/test, or set PG_BIN_DIR)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok())
    });
    dirs.pop().expect("no /usr/lib/postgresql/*/bin/initdb")
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.trim_ascii() == b"0").unwrap_or(false)
}

/// Runs a Postgres binary, as the `postgres` user when we are root (initdb refuses root).
pub fn pg_command(bin: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin);
        c
    } else {
        Command::new(bin)
    }
}

pub fn give_to_postgres(path: &Path) {
    if is_root() {
        let ok = Command::new("chown").args(["-R", "postgres"]).arg(path).status().unwrap().success();
        assert!(ok, "chown postgres {}", path.display());
    }
}

/// A Postgres server that accepts only TLS connections (`hostnossl … reject`), with the
/// test PKI's server certificate; stopped (immediate) and deleted when dropped.
pub struct TlsPostgres {
    pub port: u16,
    bin: PathBuf,
    data: PathBuf,
    _dir: TempDir,
}

impl TlsPostgres {
    pub async fn start(pki: &TestPki) -> Self {
        let bin = pg_bin_dir();
        let dir = TempDir::new("pgtls");
        let data = dir.0.join("data");
        give_to_postgres(&dir.0);
        let out = pg_command(&bin.join("initdb"))
            .args(["-D"])
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::copy(&pki.server_cert, data.join("server.crt")).unwrap();
        std::fs::copy(&pki.server_key, data.join("server.key")).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(data.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 0.0.0.0/0 reject\n",
        )
        .unwrap();
        give_to_postgres(&data);
        let port = super::app::free_port();
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file=server.crt \
             -c ssl_key_file=server.key -c fsync=off",
            data.display()
        );
        let server = Self { port, bin, data, _dir: dir };
        let out = pg_command(&server.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&server.data)
            .arg("-l")
            .arg(server.data.join("server.log"))
            .args(["-w", "-t", "60", "-o", &opts, "start"])
            .stdout(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
        server
    }

    /// `postgres://postgres@<host>:<port>/postgres?<query>`.
    pub fn url(&self, host: &str, query: &str) -> String {
        let sep = if query.is_empty() { "" } else { "?" };
        format!("postgres://postgres@{host}:{}/postgres{sep}{query}", self.port)
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let _ = pg_command(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn redis_server() -> Command {
    Command::new(std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into()))
}

/// A redis-server that listens only on a TLS port (no plain port), killed when dropped.
pub struct TlsRedis {
    pub port: u16,
    child: Child,
}

impl TlsRedis {
    pub async fn start(pki: &TestPki) -> Self {
        let port = super::app::free_port();
        let child = redis_server()
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--tls-auth-clients", "no"])
            .arg("--tls-cert-file")
            .arg(&pki.server_cert)
            .arg("--tls-key-file")
            .arg(&pki.server_key)
            .arg("--tls-ca-cert-file")
            .arg(&pki.ca)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let server = Self { port, child };
        wait_until("the TLS redis-server to listen", Duration::from_secs(10), async || listening(port).await).await;
        server
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Redis Cluster of three masters (no replicas) on loopback, killed when dropped.
pub struct RedisCluster {
    pub ports: Vec<u16>,
    nodes: Vec<Option<Child>>,
    _dir: TempDir,
}

/// A port `p` with `p` and its cluster bus port `p + 10000` both free.
fn cluster_port() -> u16 {
    loop {
        let p = super::app::free_port();
        if p < 55_000 && std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

impl RedisCluster {
    pub async fn start() -> Self {
        let dir = TempDir::new("rcluster");
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 3 {
            let p = cluster_port();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        let mut nodes = Vec::new();
        for p in &ports {
            let child = redis_server()
                .args(["--port", &p.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .arg("--cluster-config-file")
                .arg(dir.0.join(format!("nodes-{p}.conf")))
                .arg("--dir")
                .arg(&dir.0)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server");
            nodes.push(Some(child));
        }
        let cluster = Self { ports: ports.clone(), nodes, _dir: dir };
        for p in &ports {
            let p = *p;
            wait_until("a cluster node to listen", Duration::from_secs(10), async || listening(p).await).await;
        }
        let out = Command::new(std::env::var("REDIS_CLI_BIN").unwrap_or_else(|_| "redis-cli".into()))
            .arg("--cluster")
            .arg("create")
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(out.status.success(), "redis-cli --cluster create: {}", String::from_utf8_lossy(&out.stdout));
        for p in &ports {
            let p = *p;
            wait_until("cluster_state:ok", Duration::from_secs(20), async || {
                cluster_info(p).await.is_some_and(|i| i.contains("cluster_state:ok"))
            })
            .await;
        }
        cluster
    }

    /// The seed list for `REDIS_URL` (with `REDIS_CLUSTER=true`).
    pub fn url(&self) -> String {
        self.ports.iter().map(|p| format!("redis://127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// SIGKILL one master.
    pub fn kill(&mut self, index: usize) {
        if let Some(mut c) = self.nodes[index].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The index of the master that serves `key`'s slot.
    pub async fn master_of(&self, key: &str) -> usize {
        let slot: i64 = node_query(self.ports[0], redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await.unwrap();
        let slots: Vec<(i64, i64, Vec<redis::Value>)> = node_query(self.ports[0], redis::cmd("CLUSTER").arg("SLOTS"))
            .await
            .map(|v: Vec<redis::Value>| {
                v.into_iter()
                    .filter_map(|r| match r {
                        redis::Value::Array(mut a) if a.len() >= 3 => {
                            let node = a.split_off(2);
                            let (redis::Value::Int(lo), redis::Value::Int(hi)) = (&a[0], &a[1]) else { return None };
                            Some((*lo, *hi, node))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .unwrap();
        let (_, _, node) = slots.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(&slot)).expect("slot served");
        let Some(redis::Value::Array(master)) = node.first() else { panic!("no master in CLUSTER SLOTS") };
        let Some(redis::Value::Int(port)) = master.get(1) else { panic!("no port in CLUSTER SLOTS") };
        self.ports.iter().position(|p| i64::from(*p) == *port).expect("a known node")
    }

    /// Keys stored on master `index` (read directly from that node).
    pub async fn keys_on(&self, index: usize) -> Vec<String> {
        node_query(self.ports[index], redis::cmd("KEYS").arg("*")).await.unwrap_or_default()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

async fn node_query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Option<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    cmd.query_async(&mut conn).await.ok()
}

async fn cluster_info(port: u16) -> Option<String> {
    node_query(port, redis::cmd("CLUSTER").arg("INFO")).await
}

/// A master, one replica and one Sentinel (quorum 1, master down after 1 s), killed when
/// dropped.
pub struct RedisSentinel {
    pub master_port: u16,
    pub replica_port: u16,
    pub sentinel_port: u16,
    master: Option<Child>,
    others: Vec<Child>,
    _dir: TempDir,
}

pub const SENTINEL_MASTER: &str = "x4rmaster";

/// A redis-server whose files (a replica's RDB from the initial sync) go to `dir`.
fn plain_redis(port: u16, dir: &Path, extra: &[&str]) -> Child {
    redis_server()
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server")
}

impl RedisSentinel {
    pub async fn start() -> Self {
        let dir = TempDir::new("rsentinel");
        let (master_port, replica_port, sentinel_port) =
            (super::app::free_port(), super::app::free_port(), super::app::free_port());
        let (master_dir, replica_dir) = (dir.0.join("master"), dir.0.join("replica"));
        std::fs::create_dir_all(&master_dir).unwrap();
        std::fs::create_dir_all(&replica_dir).unwrap();
        let master = plain_redis(master_port, &master_dir, &[]);
        let replica = plain_redis(replica_port, &replica_dir, &["--replicaof", "127.0.0.1", &master_port.to_string()]);
        // Sentinel rewrites its configuration file: it must be writable and its own.
        let conf = dir.0.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
                 sentinel failover-timeout {SENTINEL_MASTER} 10000\n",
                dir.0.display()
            ),
        )
        .unwrap();
        let sentinel = redis_server()
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let this = Self {
            master_port,
            replica_port,
            sentinel_port,
            master: Some(master),
            others: vec![replica, sentinel],
            _dir: dir,
        };
        // Ready: the replica is in sync and the Sentinel has discovered it.
        wait_until("the replica to sync", Duration::from_secs(20), async || {
            node_query::<String>(replica_port, &redis::cmd("INFO").arg("replication").clone())
                .await
                .is_some_and(|i| i.contains("master_link_status:up"))
        })
        .await;
        wait_until("the Sentinel to see the replica", Duration::from_secs(20), async || {
            let replicas: Option<Vec<redis::Value>> =
                node_query(sentinel_port, redis::cmd("SENTINEL").arg("REPLICAS").arg(SENTINEL_MASTER)).await;
            replicas.is_some_and(|r| !r.is_empty())
        })
        .await;
        this
    }

    /// The port of the master as the Sentinel reports it now.
    pub async fn current_master_port(&self) -> Option<u16> {
        let addr: Option<(String, String)> =
            node_query(self.sentinel_port, redis::cmd("SENTINEL").arg("GET-MASTER-ADDR-BY-NAME").arg(SENTINEL_MASTER))
                .await;
        addr.and_then(|(_, port)| port.parse().ok())
    }

    /// SIGKILL the current master.
    pub fn kill_master(&mut self) {
        if let Some(mut c) = self.master.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        self.kill_master();
        for c in &mut self.others {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
