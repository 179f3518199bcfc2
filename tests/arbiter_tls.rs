//! TLS to a MariaDB arbiter. The machine's shared MariaDB has TLS disabled, so this test runs a
//! throwaway instance of its own on a free loopback port, with a CA and a server certificate it
//! generates, and a user that the server only admits over TLS. The configuration goes through
//! the real `[arbiter]` parsing, including `password_file` and `ca_file`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use twinlease::config::{Config, LocalAddrs};
use twinlease::election::backend::{AnyBackend, Backend, InitOutcome};
use twinlease::election::{ArbiterError, Beat, Claim, Uuid};

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

struct Maria {
    dir: tempfile::TempDir,
    child: Child,
    port: u16,
}

impl Maria {
    fn socket(&self) -> PathBuf {
        self.dir.path().join("mysqld.sock")
    }

    fn sql(&self, sql: &str) -> String {
        run(Command::new("mariadb")
            .arg(format!("--socket={}", self.socket().display()))
            .args(["-uroot", "-N", "-e", sql]))
    }

    fn start() -> Maria {
        let dir = tempfile::Builder::new().prefix("tl-maria-").tempdir().unwrap();
        let d = &dir.path().to_path_buf();
        // A CA and a server certificate for localhost / 127.0.0.1 signed by it.
        let sh = |script: &str| run(Command::new("bash").arg("-ec").arg(script).current_dir(d));
        sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=twinlease-test-ca 2>/dev/null
            openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null
            printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nbasicConstraints=CA:FALSE\\nextendedKeyUsage=serverAuth\\n' > ext.cnf
            openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile ext.cnf 2>/dev/null
            mkdir data");
        let mysql =
            nix::unistd::User::from_name("mysql").unwrap().expect("a mysql user (Debian package mariadb-server)");
        for entry in std::fs::read_dir(d).unwrap().map(|e| e.unwrap().path()).chain([d.to_path_buf()]) {
            std::os::unix::fs::chown(&entry, Some(mysql.uid.as_raw()), Some(mysql.gid.as_raw())).unwrap();
        }
        run(Command::new("mariadb-install-db")
            .args(["--no-defaults", "--user=mysql", "--skip-test-db", "--auth-root-authentication-method=socket"])
            .arg(format!("--datadir={}", d.join("data").display()))
            .stdout(Stdio::null()));
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let child = Command::new("mariadbd")
            .args([
                "--no-defaults",
                "--user=mysql",
                "--bind-address=127.0.0.1",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
                "--skip-name-resolve",
            ])
            .arg(format!("--port={port}"))
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", d.join("mysqld.pid").display()))
            .arg(format!("--ssl-ca={}", d.join("ca.pem").display()))
            .arg(format!("--ssl-cert={}", d.join("server.pem").display()))
            .arg(format!("--ssl-key={}", d.join("server.key").display()))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("mariadbd.log")).unwrap())
            .spawn()
            .unwrap();
        let m = Maria { dir, child, port };
        let start = Instant::now();
        while Command::new("mariadb")
            .arg(format!("--socket={}", m.socket().display()))
            .args(["-uroot", "-e", "select 1"])
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "mariadbd did not start:\n{}",
                std::fs::read_to_string(d.join("mariadbd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            m.sql("SHOW VARIABLES LIKE 'have_ssl'").contains("YES"),
            "TLS not enabled:\n{}",
            std::fs::read_to_string(d.join("mariadbd.log")).unwrap_or_default()
        );
        m.sql("CREATE DATABASE arbiter; CREATE USER 'twinlease'@'%' IDENTIFIED BY 'arbiter-secret-42' REQUIRE SSL; GRANT ALL ON arbiter.* TO 'twinlease'@'%';");
        m
    }

    fn config(&self, host: &str, tls: &str, ca: Option<&Path>) -> Config {
        let pw = self.dir.path().join("password");
        std::fs::write(&pw, "arbiter-secret-42\n").unwrap();
        // The password file is a secret: refused unless only its owner may read it.
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let ca = ca.map(|p| format!("ca_file = \"{}\"\n", p.display())).unwrap_or_default();
        let text = format!(
            "[node]\nname = \"a\"\n[[subnet]]\ncidr = \"198.18.0.0/24\"\npools = [\"198.18.0.100-198.18.0.110\"]\n\
             [arbiter]\nurl = \"mysql://twinlease@{host}:{}/arbiter\"\nutype = \"tls/dhcp\"\npassword_file = \"{}\"\ntls = \"{tls}\"\n{ca}",
            self.port,
            pw.display()
        );
        Config::parse(Path::new("tls.toml"), &text, &LocalAddrs::default()).unwrap()
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

impl Drop for Maria {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mysql(b: &mut AnyBackend) -> &mut twinlease::election::backend::mysql::MyBackend {
    match b {
        AnyBackend::Mysql(m) => m,
        _ => panic!("not a MariaDB backend"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_with_tls_require_verifies_and_encrypts() {
    let m = Maria::start();
    let cfg = m.config("localhost", "require", Some(&m.ca()));
    let a = cfg.arbiter.as_ref().unwrap();
    let mut b = AnyBackend::from_config(a).unwrap();
    assert!(mysql(&mut b).is_encrypted().await.unwrap(), "session must be encrypted");
    assert_eq!(b.init(&a.utype, 5000).await.unwrap(), InitOutcome::Ready);
    let claim = Claim {
        utype: a.utype.clone(),
        uuid: Uuid::new_v4(),
        name: "a".into(),
        endpoint: "e".into(),
        timeout_ms: 5000,
        min_term: 0,
    };
    assert!(matches!(b.heartbeat(&claim).await.unwrap(), Beat::Applied { term: 1, .. }));
    assert_eq!(b.read(&a.utype).await.unwrap().unwrap().uuid, claim.uuid);

    // The IP is in the certificate too; "prefer" uses TLS when offered.
    let mut ip =
        AnyBackend::from_config(m.config("127.0.0.1", "prefer", Some(&m.ca())).arbiter.as_ref().unwrap()).unwrap();
    assert!(mysql(&mut ip).is_encrypted().await.unwrap());

    // Plain text is refused by this server for this user (REQUIRE SSL).
    let mut plain = AnyBackend::from_config(m.config("127.0.0.1", "off", None).arbiter.as_ref().unwrap()).unwrap();
    let e = plain.read(&a.utype).await.expect_err("REQUIRE SSL user over plain TCP");
    assert!(matches!(e, ArbiterError::Connect { .. }) && e.to_string().contains("Access denied"), "{e}");

    // A CA that did not sign the server's certificate is refused.
    let other_ca = m.dir.path().join("other-ca.pem");
    run(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=someone-else"])
        .arg("-keyout")
        .arg(m.dir.path().join("other.key"))
        .arg("-out")
        .arg(&other_ca)
        .stderr(Stdio::null()));
    let mut untrusted =
        AnyBackend::from_config(m.config("localhost", "require", Some(&other_ca)).arbiter.as_ref().unwrap()).unwrap();
    let e = untrusted.read(&a.utype).await.expect_err("untrusted certificate");
    assert!(matches!(e, ArbiterError::Connect { .. }) && e.to_string().to_lowercase().contains("certificate"), "{e}");
}
