//! A Postgres primary and a synchronous streaming-replication standby, private to one test
//! (initdb and pg_basebackup into a temp dir, as the `postgres` user when we are root), both
//! stopped (immediate) and deleted when dropped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use super::tls_services::{TempDir, TestPki, give_to_postgres, pg_bin_dir, pg_command, wait_until};

/// The standby's `application_name`, named in the primary's `synchronous_standby_names`.
pub const STANDBY_NAME: &str = "standby1";

/// One server of the pair.
pub struct PgNode {
    pub port: u16,
    data: PathBuf,
    running: bool,
}

pub struct PgPair {
    pub primary: PgNode,
    pub standby: PgNode,
    bin: PathBuf,
    tls: bool,
    _dir: TempDir,
}

fn run(mut cmd: std::process::Command, what: &str) {
    let out = cmd.stdout(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
}

impl PgPair {
    /// Starts the primary (with `synchronous_standby_names` = the standby, so a commit
    /// returns only once the standby has it), clones it into the standby with pg_basebackup,
    /// starts the standby and waits until it is the synchronous one. With `pki`, both servers
    /// speak TLS with the PKI's server certificate.
    pub async fn start(pki: Option<&TestPki>) -> Self {
        let bin = pg_bin_dir();
        let dir = TempDir::new("pgpair");
        give_to_postgres(&dir.0);
        let primary = PgNode { port: super::app::free_port(), data: dir.0.join("primary"), running: false };
        let standby = PgNode { port: super::app::free_port(), data: dir.0.join("standby"), running: false };
        let mut initdb = pg_command(&bin.join("initdb"));
        initdb.arg("-D").arg(&primary.data).args(["-U", "postgres", "--auth=trust", "--no-sync"]);
        run(initdb, "initdb");
        if let Some(pki) = pki {
            std::fs::copy(&pki.server_cert, primary.data.join("server.crt")).unwrap();
            std::fs::copy(&pki.server_key, primary.data.join("server.key")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(primary.data.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
            give_to_postgres(&primary.data);
        }
        let mut pair = Self { primary, standby, bin, tls: pki.is_some(), _dir: dir };
        pair.start_node(true);
        wait_until("the primary to accept connections", Duration::from_secs(30), async || {
            pair.query(pair.primary.port, "SELECT 1").await.is_some()
        })
        .await;
        let mut base = pg_command(&pair.bin.join("pg_basebackup"));
        base.args(["-h", "127.0.0.1", "-p", &pair.primary.port.to_string(), "-U", "postgres", "-X", "stream", "-R"])
            .arg("-D")
            .arg(&pair.standby.data);
        run(base, "pg_basebackup");
        // -R wrote standby.signal and a primary_conninfo; name the standby for the primary's
        // synchronous_standby_names (the last setting in the file wins).
        let auto = pair.standby.data.join("postgresql.auto.conf");
        let mut conf = std::fs::read_to_string(&auto).unwrap();
        conf.push_str(&format!(
            "primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}'\n",
            pair.primary.port
        ));
        std::fs::write(&auto, conf).unwrap();
        give_to_postgres(&pair.standby.data);
        pair.start_node(false);
        let sync = format!(
            "SELECT count(*)::text FROM pg_stat_replication WHERE application_name = '{STANDBY_NAME}' \
             AND sync_state = 'sync' AND state = 'streaming'"
        );
        wait_until("the standby to stream synchronously", Duration::from_secs(30), async || {
            pair.query(pair.primary.port, &sync).await.as_deref() == Some("1")
        })
        .await;
        pair
    }

    fn start_node(&mut self, primary: bool) {
        let node = if primary { &self.primary } else { &self.standby };
        let mut opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c wal_level=replica -c max_wal_senders=5 \
             -c hot_standby=on",
            node.port,
            node.data.display()
        );
        if primary {
            opts.push_str(&format!(" -c synchronous_standby_names={STANDBY_NAME} -c synchronous_commit=on"));
        }
        if self.tls {
            opts.push_str(" -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key");
        }
        let mut cmd = pg_command(&self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(&node.data).arg("-l").arg(node.data.join("server.log"));
        cmd.args(["-w", "-t", "60", "-o", &opts, "start"]);
        run(cmd, "pg_ctl start");
        if primary {
            self.primary.running = true;
        } else {
            self.standby.running = true;
        }
    }

    /// One value (as text) from `sql` on the server at `port` (loopback TCP); `None` when it
    /// cannot be read.
    pub async fn query(&self, port: u16, sql: &str) -> Option<String> {
        self.query_in(port, "postgres", sql).await
    }

    /// [`Self::query`] in database `dbname`.
    pub async fn query_in(&self, port: u16, dbname: &str, sql: &str) -> Option<String> {
        let mode = if self.tls { "require" } else { "disable" };
        let url = format!("host=127.0.0.1 port={port} user=postgres dbname={dbname} sslmode={mode}");
        let connector = x402_router::db::Connector::from_url(&url).ok()?;
        let mut conn = connector.connect().await.ok()?;
        #[derive(diesel::QueryableByName)]
        struct One {
            #[diesel(sql_type = diesel::sql_types::Text)]
            v: String,
        }
        use diesel_async::RunQueryDsl;
        let row: One = diesel::sql_query(format!("SELECT ({sql})::text AS v")).get_result(&mut conn).await.ok()?;
        Some(row.v)
    }

    /// Runs one statement on the server at `port` (e.g. `CREATE DATABASE`).
    pub async fn exec(&self, port: u16, sql: &str) {
        let mode = if self.tls { "require" } else { "disable" };
        let url = format!("host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode={mode}");
        let mut conn = x402_router::db::Connector::from_url(&url).unwrap().connect().await.unwrap();
        use diesel_async::RunQueryDsl;
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }

    /// Stops the primary at once (`-m immediate`: as if the machine died).
    pub fn crash_primary(&mut self) {
        stop(&self.bin, &mut self.primary);
    }

    /// `pg_ctl promote` on the standby, waiting until it accepts writes.
    pub fn promote_standby(&self) {
        let mut cmd = pg_command(&self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(&self.standby.data).args(["-w", "-t", "60", "promote"]);
        run(cmd, "pg_ctl promote");
    }

    /// A connection string of both servers, primary first, that connects to whichever one
    /// accepts writes (`target_session_attrs=read-write`). `extra` is appended (key=value).
    pub fn conninfo(&self, dbname: &str, extra: &str) -> String {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname={dbname} target_session_attrs=read-write {extra}",
            self.primary.port, self.standby.port
        )
    }
}

/// One private Postgres server with extra server options (e.g. a preloaded library),
/// stopped (immediate) and deleted when dropped.
pub struct PgServer {
    pub node: PgNode,
    bin: PathBuf,
    _dir: TempDir,
}

impl PgServer {
    pub async fn start(extra_options: &str) -> Self {
        let bin = pg_bin_dir();
        let dir = TempDir::new("pgsrv");
        give_to_postgres(&dir.0);
        let node = PgNode { port: super::app::free_port(), data: dir.0.join("data"), running: false };
        let mut initdb = pg_command(&bin.join("initdb"));
        initdb.arg("-D").arg(&node.data).args(["-U", "postgres", "--auth=trust", "--no-sync"]);
        run(initdb, "initdb");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off {extra_options}",
            node.port,
            node.data.display()
        );
        let mut cmd = pg_command(&bin.join("pg_ctl"));
        cmd.arg("-D").arg(&node.data).arg("-l").arg(node.data.join("server.log"));
        cmd.args(["-w", "-t", "60", "-o", &opts, "start"]);
        run(cmd, "pg_ctl start");
        let mut server = Self { node, bin, _dir: dir };
        server.node.running = true;
        server
    }

    /// libpq key/value pairs for database `dbname` on this server.
    pub fn conninfo(&self, dbname: &str) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname={dbname} sslmode=disable", self.node.port)
    }

    /// Runs one statement in database `dbname`.
    pub async fn exec(&self, dbname: &str, sql: &str) {
        let mut conn = x402_router::db::Connector::from_url(&self.conninfo(dbname)).unwrap().connect().await.unwrap();
        use diesel_async::RunQueryDsl;
        diesel::sql_query(sql).execute(&mut conn).await.unwrap();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        stop(&self.bin, &mut self.node);
    }
}

fn stop(bin: &std::path::Path, node: &mut PgNode) {
    if !node.running {
        return;
    }
    let _ = pg_command(&bin.join("pg_ctl"))
        .arg("-D")
        .arg(&node.data)
        .args(["-m", "immediate", "-w", "stop"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    node.running = false;
}

impl Drop for PgPair {
    fn drop(&mut self) {
        stop(&self.bin, &mut self.primary);
        stop(&self.bin, &mut self.standby);
    }
}
