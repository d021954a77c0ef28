//! Azurite, Microsoft's Azure Blob Storage server (an npm package, run with Node.js), on a
//! loopback port of its own: the real protocol for the tests of `az://` mounts. The package is
//! installed once per machine, at an exact version, into `target/azurite` of the workspace
//! (`npm`: Debian packages `nodejs` and `npm`).
#![allow(clippy::unwrap_used)]

use std::{
    io,
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

/// The version installed.
pub const VERSION: &str = "3.35.0";

/// Azurite's well-known development account and its key (public, the same in every Azurite).
pub const ACCOUNT: &str = "devstoreaccount1";
pub const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// Creates container `CONTAINER` on `ENDPOINT` with a SharedKey-signed request (Azurite takes no
/// unsigned one): Node.js has the HMAC it needs, the tests' Rust side has none.
const CREATE_CONTAINER: &str = r#"
const crypto = require("crypto"), http = require("http");
const { ENDPOINT, ACCOUNT, ACCOUNT_KEY, CONTAINER } = process.env;
const url = new URL(`${ENDPOINT}/${ACCOUNT}/${CONTAINER}?restype=container`);
const date = new Date().toUTCString(), version = "2021-08-06";
const toSign = ["PUT", "", "", "", "", "", "", "", "", "", "", "",
  `x-ms-date:${date}`, `x-ms-version:${version}`,
  `/${ACCOUNT}/${ACCOUNT}/${CONTAINER}`, "restype:container"].join("\n");
const sig = crypto.createHmac("sha256", Buffer.from(ACCOUNT_KEY, "base64"))
  .update(toSign, "utf8").digest("base64");
const req = http.request(url, { method: "PUT", headers: {
  "x-ms-date": date, "x-ms-version": version, "Content-Length": 0,
  Authorization: `SharedKey ${ACCOUNT}:${sig}` } }, (res) => {
  let body = "";
  res.on("data", (d) => (body += d));
  res.on("end", () => {
    if (res.statusCode !== 201) { console.error(res.statusCode, body); process.exit(1); }
  });
});
req.on("error", (e) => { console.error(e.message); process.exit(1); });
req.end();
"#;

/// A running Azurite blob server; dropping it stops it.
#[derive(Debug)]
pub struct Azurite {
    child: Child,
    port: u16,
}

impl Azurite {
    /// Starts the blob service on a free port of 127.0.0.1 with its data under `dir`, and waits
    /// (at most 30 s) until it takes connections.
    pub fn start(dir: &Path) -> io::Result<Azurite> {
        let bin = installed();
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let log = std::fs::File::create(dir.join("azurite.log"))?;
        let child = Command::new(bin)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .arg("--location")
            .arg(dir)
            .args(["--silent", "--loose", "--skipApiVersionCheck"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut a = Azurite { child, port };
        let start = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
            if let Some(status) = a.child.try_wait()? {
                return Err(io::Error::other(format!(
                    "azurite exited with {status}: see {}",
                    dir.join("azurite.log").display()
                )));
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err(io::Error::other("azurite did not listen within 30 s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(a)
    }

    /// The blob endpoint of the development account, as an `az://` mount's `endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// Creates container `name`.
    pub fn create_container(&self, name: &str) -> io::Result<()> {
        let out = Command::new("node")
            .args(["-e", CREATE_CONTAINER])
            .env("ENDPOINT", format!("http://127.0.0.1:{}", self.port))
            .env("ACCOUNT", ACCOUNT)
            .env("ACCOUNT_KEY", ACCOUNT_KEY)
            .env("CONTAINER", name)
            .output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "creating container {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `azurite-blob` of the installed package, installed on first use. Panics with what to install
/// when npm is missing or fails.
fn installed() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    static SETUP: Mutex<()> = Mutex::new(());
    let _g = SETUP.lock().unwrap_or_else(|p| p.into_inner());
    BIN.get_or_init(|| {
        let dir = crate::python::workspace_root()
            .join("target")
            .join("azurite");
        let bin = dir.join("node_modules").join(".bin").join("azurite-blob");
        let version_file = dir.join("node_modules/azurite/package.json");
        let current = std::fs::read_to_string(&version_file)
            .is_ok_and(|p| p.contains(&format!("\"version\": \"{VERSION}\"")));
        if bin.is_file() && current {
            return bin;
        }
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .arg(format!("azurite@{VERSION}"))
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "npm: {e}: the az:// tests need Node.js and npm (apt-get install nodejs npm)"
                )
            });
        assert!(
            out.status.success() && bin.is_file(),
            "npm install azurite@{VERSION} into {}: {}{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
    .clone()
}
