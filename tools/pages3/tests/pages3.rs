//! The S3 gateway `pages3` in front of three real `pagestored` processes over a local
//! directory, driven by real S3 clients: boto3 and s3fs from a Python virtual environment
//! (created under `target/pyenv` on first use), and object_store's S3 client from Rust.
//!
//! Covered: ListBuckets, GetBucketLocation, HeadBucket; ListObjectsV2 (and v1) with prefixes,
//! the `/` delimiter, start-after, continuation tokens and small max-keys over a directory of
//! 10,000 files; whole and ranged GetObject (206 + Content-Range, 416 past the end), HeadObject,
//! If-Match; SigV4 (a wrong secret and an unknown key get 403, unsigned requests are refused
//! unless `--anonymous`, which allows reads only); `..` and percent-encoded traversal refused
//! (also as raw signed requests); PutObject (small and large) then GetObject returning the new
//! bytes at once; a three-part multipart upload; DeleteObject; a gateway without `--mount`
//! refusing writes; a clean stop on SIGTERM; and a refusal to start without credentials.
//!
//! Issue 16, in the same test over the same cluster and virtual environment: `S3_RULES_SCRIPT`
//! (boto3 and raw signed requests: every conditional-request rule on GET, HEAD, PUT,
//! CompleteMultipartUpload, DELETE and DeleteObjects; ETags in v1 and v2 listings equal to
//! HEAD's, part ETags as MD5s, `md5-N` multipart ETags; directory markers; deletes of
//! directories and missing keys; 409 object/prefix conflicts; RequestId in error bodies;
//! repeated completions; ListMultipartUploads; ListParts; CopyObject; UploadPartCopy; GetObjectAttributes;
//! SSE refused; object attributes and user metadata kept; listing details) and `CLIENTS_SCRIPT` (AWS CLI `s3 sync` twice, `cp`, `rm`;
//! s3cmd `sync` twice, a 30 MB multipart `put`, a recursive `get`; pyarrow's S3FileSystem
//! `create_dir`, `copy_file`, `move`, `delete_dir_contents`; s3fs `rm(recursive=True)`; rclone
//! `copy` twice and `check` with hashes).
//!
//! `pages3_refuses_what_s3_refuses` (issue 12): SigV2 refused, or held to the clock with
//! `--allow-sigv2`; presigned lifetimes; Content-MD5 and x-amz-checksum-* verified; cut or
//! mislabelled aws-chunked bodies refused; errors without server paths; KeyTooLongError; ranges
//! S3 ignores; DeleteObjects over 1,000 keys; a stalled body; connection limits and the header
//! deadline; a full store (RLIMIT_FSIZE); a gateway killed mid-upload and restarted. Raw
//! requests are signed by the helpers in `RAW_HELPERS` (SigV4, aws-chunked, SigV2).
//!
//! `objects_listed_without_etags_keep_the_stores_etag`: a bucket over an S3 store (s3s-fs, whose
//! listings carry no ETags) lists without ETags, and HEAD and GET after the listing give the
//! store's.
#![allow(clippy::unwrap_used)]

use pagestore_testkit::fixture as common;

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use common::{bytes, Cluster};
use futures_util::TryStreamExt;
use object_store::{aws::AmazonS3Builder, path::Path as StorePath, ObjectStore, ObjectStoreExt};

const PAGES3: &str = env!("CARGO_BIN_EXE_pages3");
const KEY: &str = "pages3-test-key";
const SECRET: &str = "pages3-test-secret/with+odd=chars";
const MIB: usize = 1 << 20;
const BIG_DIR_FILES: usize = 10_000;

/// Files under the bucket `tree/` (nested directories, names that sort around `/`).
const TREE: &[&str] = &[
    "tree/a-b.txt",
    "tree/a/x.bin",
    "tree/a/y/z.bin",
    "tree/a0.txt",
    "tree/b/c/d/e.bin",
    "tree/top.txt",
];

/// A running gateway; killed when dropped.
struct Gateway {
    child: Child,
    endpoint: String,
    log: PathBuf,
}

impl Gateway {
    /// A gateway with the test credentials that writes through `mount` (`/LOGICAL=URL`).
    fn writable(c: &Cluster, name: &str, mount: &str) -> Gateway {
        let args = [
            "--access-key",
            KEY,
            "--secret-key",
            SECRET,
            "--mount",
            mount,
        ];
        Gateway::start(c, name, &args)
    }

    fn start(c: &Cluster, name: &str, extra: &[&str]) -> Gateway {
        Gateway::start_with(c, name, extra, None)
    }

    /// With `max_file_size`, the gateway runs under that RLIMIT_FSIZE (SIGXFSZ ignored, so
    /// that writes past it fail with EFBIG, as they fail with ENOSPC on a full disk).
    fn start_with(c: &Cluster, name: &str, extra: &[&str], max_file_size: Option<u64>) -> Gateway {
        let log = c.dir.path().join(format!("{name}.log"));
        let staging = c.dir.path().join(format!("{name}-staging"));
        let mut cmd = Command::new(PAGES3);
        cmd.args(["--listen", "127.0.0.1:0", "--cluster"])
            .arg(&c.members)
            .arg("--tls-dir")
            .arg(&c.ca_dir)
            .arg("--staging-dir")
            .arg(&staging)
            .args(extra)
            .env_remove("PAGES3_ACCESS_KEY")
            .env_remove("PAGES3_SECRET_KEY")
            .env("PAGESTORE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(limit) = max_file_size {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec the closure only calls async-signal-safe functions
            // (signal, setrlimit) on values it owns.
            unsafe {
                cmd.pre_exec(move || {
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    let r = libc::rlimit {
                        rlim_cur: limit,
                        rlim_max: limit,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("ready ") {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(endpoint) => Gateway {
                child,
                endpoint,
                log,
            },
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "pages3 did not print its ready line within 30 s; its log:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// object_store's S3 client for `bucket` through this gateway (path-style, the test's
    /// credentials).
    fn object_store(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_allow_http(true)
            .with_access_key_id(KEY)
            .with_secret_access_key(SECRET)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_virtual_hosted_style_request(false)
            .build()
            .unwrap()
    }

    /// SIGTERM, then the exit status (within 20 s).
    fn terminate(&mut self) -> std::process::ExitStatus {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "pages3 did not stop within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shared virtual environment's python (boto3, s3fs, the AWS CLI, s3cmd, pyarrow; see
/// `pagestore_testkit::python`), created on first use.
fn python() -> PathBuf {
    pagestore_testkit::python::python()
}

/// Runs a Python script (written to a temporary file); panics with its output if it fails.
fn run_python(name: &str, script: &str, env: &[(&str, String)], gw: &[&Gateway]) {
    let py = python();
    let mut file = tempfile::Builder::new()
        .prefix(name)
        .suffix(".py")
        .tempfile()
        .unwrap();
    std::io::Write::write_all(&mut file, script.as_bytes()).unwrap();
    let t0 = Instant::now();
    let out = Command::new(py)
        .arg(file.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .unwrap();
    let logs = gw.iter().map(|g| g.log()).collect::<Vec<_>>().join("\n");
    assert_all_ok(name, &out, &format!("--- gateway logs\n{logs}"));
    eprintln!("{name}: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Panics with `what`'s output and `logs` unless it exited 0 and printed `ALL OK`.
fn assert_all_ok(what: &str, out: &std::process::Output, logs: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "{what} failed ({:?}):\n--- stdout\n{stdout}\n--- stderr\n{}\n{logs}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
    );
}

fn cluster_with_data() -> (Cluster, PathBuf) {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    let write = |rel: &str, b: &[u8]| {
        let p = data.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    };
    for i in 0..BIG_DIR_FILES {
        write(&format!("big/f{i:05}"), format!("{i}\n").as_bytes());
    }
    write("objs/a.bin", &bytes(1, 3 * MIB + 12_345));
    write("objs/small.txt", b"hello pages3\n");
    write("objs/empty", b"");
    write("objs/with space+plus.txt", b"odd name\n");
    for (i, t) in TREE.iter().enumerate() {
        write(t, &bytes(100 + i as u64, 1000 + i));
    }
    write("readme.txt", b"top-level file of the bucket\n");
    s.mounts = vec![format!("/data=file://{}", data.display())];
    (Cluster::start(dir, s), data)
}

const S3FS_SCRIPT: &str = r#"
import os, fsspec, s3fs
EP, KEY, SECRET, DATA = (os.environ[k] for k in ("EP", "KEY", "SECRET", "DATA"))
TREE = os.environ["TREE"].split(",")

def check(cond, *msg):
    if not cond:
        raise AssertionError(" ".join(map(str, msg)))

a = open(os.path.join(DATA, "objs/a.bin"), "rb").read()
fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": EP})

check([b.rstrip("/") for b in fs.ls("")] == ["data"], fs.ls(""))
top = sorted(fs.ls("data"))
check(top == ["data/big", "data/objs", "data/readme.txt", "data/tree"], top)
objs = sorted(fs.ls("data/objs"))
check("data/objs/a.bin" in objs and "data/objs/with space+plus.txt" in objs, objs)
tree = sorted(fs.ls("data/tree"))
check(tree == ["data/tree/a", "data/tree/a-b.txt", "data/tree/a0.txt", "data/tree/b", "data/tree/top.txt"], tree)
check(fs.isdir("data/tree/a") and not fs.isfile("data/tree/a"))
check(fs.isfile("data/objs/a.bin"))
check(not fs.exists("data/objs/nope"))
check(fs.info("data/objs/a.bin")["size"] == len(a), fs.info("data/objs/a.bin"))
found = sorted(fs.find("data/tree"))
check(found == sorted("data/" + t for t in TREE), found)

with fs.open("data/objs/a.bin", "rb") as f:
    f.seek(1048570)
    check(f.read(20) == a[1048570:1048590], "seek+read across a page boundary")
    f.seek(-10, 2)
    check(f.read() == a[-10:], "seek from the end")
    f.seek(0)
    check(f.read() == a, "whole read")
check(fs.cat_file("data/objs/a.bin", start=5, end=105) == a[5:105])
check(fs.cat("data/objs/with space+plus.txt") == b"odd name\n")

# The documented form: fsspec.open with storage options.
with fsspec.open("s3://data/objs/a.bin", "rb", key=KEY, secret=SECRET,
                 client_kwargs={"endpoint_url": EP}) as f:
    f.seek(3 * 1024 * 1024)
    check(f.read() == a[3 * 1024 * 1024:])
print("ALL OK")
"#;

const BOTO3_SCRIPT: &str = r#"
import os, sys, hashlib, http.client, urllib.parse
import boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

EP, EP_ANON, KEY, SECRET, DATA = (os.environ[k] for k in ("EP", "EP_ANON", "KEY", "SECRET", "DATA"))
TREE = os.environ["TREE"].split(",")
N = int(os.environ["BIG"])
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
             region_name="us-east-1")

def client(key=KEY, secret=SECRET, ep=EP):
    return boto3.client("s3", endpoint_url=ep, aws_access_key_id=key,
                        aws_secret_access_key=secret, config=cfg)

s3 = client()
unsigned = boto3.client("s3", endpoint_url=EP,
                        config=cfg.merge(Config(signature_version=botocore.UNSIGNED)))

def local(key):
    return open(os.path.join(DATA, key), "rb").read()

def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    raise AssertionError("expected an error")

def check(cond, *msg):
    if not cond:
        raise AssertionError(" ".join(map(str, msg)))

def status(r):
    return r["ResponseMetadata"]["HTTPStatusCode"]

# --- buckets
names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
check(names == ["data"], names)
loc = s3.get_bucket_location(Bucket="data")
check(loc.get("LocationConstraint") in (None, ""), loc)
s3.head_bucket(Bucket="data")
check(err(lambda: s3.head_bucket(Bucket="nope"))[0] == 404)
check(err(lambda: s3.list_objects_v2(Bucket="nope")) == (404, "NoSuchBucket"))
check(err(lambda: s3.get_object(Bucket="nope", Key="x")) == (404, "NoSuchBucket"))

# --- 10,000 keys through pagination
expected = ["big/f%05d" % i for i in range(N)]
keys, pages = [], 0
for page in s3.get_paginator("list_objects_v2").paginate(Bucket="data", Prefix="big/"):
    pages += 1
    keys += [o["Key"] for o in page.get("Contents", [])]
check(keys == expected, "paginator", len(keys), pages)
check(pages == 10, pages)
keys, token, calls = [], None, 0
while True:
    kw = dict(Bucket="data", Prefix="big/", MaxKeys=777)
    if token:
        kw["ContinuationToken"] = token
    r = s3.list_objects_v2(**kw)
    calls += 1
    got = [o["Key"] for o in r.get("Contents", [])]
    check(r["KeyCount"] == len(got) and len(got) <= 777, r["KeyCount"], len(got))
    keys += got
    if not r["IsTruncated"]:
        break
    token = r["NextContinuationToken"]
check(keys == expected and len(set(keys)) == N, "MaxKeys=777", len(keys))
check(calls == (N + 776) // 777, calls)
keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(
    Bucket="data", Prefix="big/f09", PaginationConfig={"PageSize": 100}) for o in p.get("Contents", [])]
check(keys == expected[9000:], "PageSize=100", len(keys))
r = s3.list_objects_v2(Bucket="data", Prefix="big/", StartAfter="big/f09990")
check([o["Key"] for o in r["Contents"]] == expected[9991:], "StartAfter")
check(all(o["Size"] == len(("%d\n" % int(o["Key"][5:]))) for o in r["Contents"]), "sizes")
keys = [o["Key"] for p in s3.get_paginator("list_objects").paginate(Bucket="data", Prefix="big/")
        for o in p.get("Contents", [])]
check(keys == expected, "ListObjects v1 paginator", len(keys))
r = s3.list_objects_v2(Bucket="data", Prefix="big/", MaxKeys=0)
check(r["KeyCount"] == 0 and not r["IsTruncated"], r)

# --- prefixes and the delimiter
r = s3.list_objects_v2(Bucket="data", Delimiter="/")
check([p["Prefix"] for p in r["CommonPrefixes"]] == ["big/", "objs/", "tree/"], r.get("CommonPrefixes"))
check([o["Key"] for o in r["Contents"]] == ["readme.txt"], r.get("Contents"))
r = s3.list_objects_v2(Bucket="data", Prefix="tree/")
check([o["Key"] for o in r["Contents"]] == sorted(TREE), [o["Key"] for o in r["Contents"]])
r = s3.list_objects_v2(Bucket="data", Prefix="tree/", Delimiter="/")
check([p["Prefix"] for p in r["CommonPrefixes"]] == ["tree/a/", "tree/b/"], r["CommonPrefixes"])
check([o["Key"] for o in r["Contents"]] == ["tree/a-b.txt", "tree/a0.txt", "tree/top.txt"])
seq, token = [], None
while True:
    kw = dict(Bucket="data", Prefix="tree/", Delimiter="/", MaxKeys=1)
    if token:
        kw["ContinuationToken"] = token
    r = s3.list_objects_v2(**kw)
    items = [o["Key"] for o in r.get("Contents", [])] + [p["Prefix"] for p in r.get("CommonPrefixes", [])]
    check(len(items) == 1 and r["KeyCount"] == 1, r)
    seq += items
    if not r["IsTruncated"]:
        break
    token = r["NextContinuationToken"]
check(seq == ["tree/a-b.txt", "tree/a/", "tree/a0.txt", "tree/b/", "tree/top.txt"], "key order", seq)
keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(
    Bucket="data", Prefix="tree/", PaginationConfig={"PageSize": 2}) for o in p.get("Contents", [])]
check(keys == sorted(TREE), "recursive, 2 per page", keys)
r = s3.list_objects_v2(Bucket="data", Prefix="tree/a")
check([o["Key"] for o in r["Contents"]] == ["tree/a-b.txt", "tree/a/x.bin", "tree/a/y/z.bin", "tree/a0.txt"], r["Contents"])
r = s3.list_objects_v2(Bucket="data", Prefix="tree/a/", Delimiter="/")
check([o["Key"] for o in r["Contents"]] == ["tree/a/x.bin"] and [p["Prefix"] for p in r["CommonPrefixes"]] == ["tree/a/y/"])
r = s3.list_objects_v2(Bucket="data", Prefix="objs/with ")
check([o["Key"] for o in r["Contents"]] == ["objs/with space+plus.txt"], r.get("Contents"))
r = s3.list_objects_v2(Bucket="data", Prefix="nothing/here/")
check(r["KeyCount"] == 0 and "Contents" not in r, r)
r = s3.list_objects(Bucket="data", Prefix="tree/", Delimiter="/")
check([p["Prefix"] for p in r["CommonPrefixes"]] == ["tree/a/", "tree/b/"], r)

# --- reads
a = local("objs/a.bin")
r = s3.get_object(Bucket="data", Key="objs/a.bin")
check(status(r) == 200 and r["ContentLength"] == len(a))
check(r["Body"].read() == a, "whole object")
etag = r["ETag"]
check(etag.startswith('"') and etag.endswith('"') and len(etag) > 2, etag)
for rng, lo, hi in [("bytes=100-1048675", 100, 1048676), ("bytes=-10", len(a) - 10, len(a)),
                    ("bytes=%d-" % (len(a) - 5), len(a) - 5, len(a)),
                    ("bytes=10-%d" % (len(a) + 100), 10, len(a)), ("bytes=0-0", 0, 1),
                    ("bytes=1048576-3145727", 1048576, 3145728)]:
    r = s3.get_object(Bucket="data", Key="objs/a.bin", Range=rng)
    check(status(r) == 206, rng, status(r))
    check(r["ContentRange"] == "bytes %d-%d/%d" % (lo, hi - 1, len(a)), rng, r["ContentRange"])
    check(r["ContentLength"] == hi - lo, rng)
    check(r["Body"].read() == a[lo:hi], "range bytes", rng)
for rng in ["bytes=%d-" % len(a), "bytes=%d-%d" % (len(a) + 10, len(a) + 20)]:
    check(err(lambda: s3.get_object(Bucket="data", Key="objs/a.bin", Range=rng)) == (416, "InvalidRange"), rng)
check(s3.get_object(Bucket="data", Key="objs/empty")["Body"].read() == b"")
check(err(lambda: s3.get_object(Bucket="data", Key="objs/empty", Range="bytes=0-0"))[0] == 416)
h = s3.head_object(Bucket="data", Key="objs/a.bin")
check(h["ContentLength"] == len(a) and h["ETag"] == etag, h)
check("LastModified" in h)
check(err(lambda: s3.head_object(Bucket="data", Key="objs/nope"))[0] == 404)
check(err(lambda: s3.get_object(Bucket="data", Key="objs/nope")) == (404, "NoSuchKey"))
check(err(lambda: s3.get_object(Bucket="data", Key="tree/a")) == (404, "NoSuchKey"))
check(err(lambda: s3.get_object(Bucket="data", Key="tree/a/")) == (404, "NoSuchKey"))
check(s3.get_object(Bucket="data", Key="objs/a.bin", IfMatch=etag)["Body"].read() == a)
check(err(lambda: s3.get_object(Bucket="data", Key="objs/a.bin", IfMatch='"other"'))[0] == 412)
check(s3.get_object(Bucket="data", Key="objs/with space+plus.txt")["Body"].read() == b"odd name\n")

# --- authentication
bad = client(secret="not-the-secret")
check(err(lambda: bad.list_objects_v2(Bucket="data")) == (403, "SignatureDoesNotMatch"))
check(err(lambda: bad.get_object(Bucket="data", Key="objs/a.bin")) == (403, "SignatureDoesNotMatch"))
check(err(lambda: bad.put_object(Bucket="data", Key="objs/x", Body=b"x")) == (403, "SignatureDoesNotMatch"))
check(err(lambda: client(key="nobody").list_buckets()) == (403, "InvalidAccessKeyId"))
check(err(lambda: unsigned.list_objects_v2(Bucket="data")) == (403, "AccessDenied"))
check(err(lambda: unsigned.get_object(Bucket="data", Key="objs/a.bin")) == (403, "AccessDenied"))
check(not os.path.exists(os.path.join(DATA, "objs/x")))

# --- traversal, through boto3 and as raw signed requests
for k in ["../etc/passwd", "objs/../objs/a.bin", "%2e%2e/etc/passwd", "objs/%2E%2E/%2e%2e/x",
          "./objs/a.bin", "objs/..%2fa.bin", "objs/%252e%252e/a.bin", "objs//a.bin"]:
    check(err(lambda: s3.get_object(Bucket="data", Key=k)) == (400, "InvalidArgument"), "get", k)
    check(err(lambda: s3.head_object(Bucket="data", Key=k))[0] == 400, "head", k)
    check(err(lambda: s3.put_object(Bucket="data", Key=k, Body=b"x")) == (400, "InvalidArgument"), "put", k)
    if "//" in k:
        # No key has an empty segment: such a prefix simply matches nothing.
        check(s3.list_objects_v2(Bucket="data", Prefix=k)["KeyCount"] == 0, "list", k)
    else:
        check(err(lambda: s3.list_objects_v2(Bucket="data", Prefix=k)) == (400, "InvalidArgument"), "list", k)

def raw(path):
    # Sent as written; signed over the canonical form (decoded once, then URI-encoded), which
    # is what the server checks.
    u = urllib.parse.urlsplit(EP)
    canonical = urllib.parse.quote(urllib.parse.unquote(path), safe="/~")
    req = AWSRequest(method="GET", url=EP + canonical,
                     headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    S3SigV4Auth(Credentials(KEY, SECRET), "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("GET", path, headers=dict(req.headers.items()))
    resp = conn.getresponse()
    return resp.status, resp.read()

st, body = raw("/data/objs/small.txt")
check(st == 200 and body == local("objs/small.txt"), "raw signed request", st, body)
for p in ["/data/%2e%2e/%2e%2e/etc/passwd", "/data/../../etc/passwd", "/data/objs/%2E%2E%2Fa.bin",
          "/data/objs/%252e%252e/a.bin", "/data/objs/./a.bin", "/data/objs/a.bin%00"]:
    st, body = raw(p)
    check(st == 400 and b"InvalidArgument" in body, "raw", p, st, body)
for p in ["/../etc/passwd", "/%2e%2e/etc/passwd"]:
    st, body = raw(p)
    check(st == 400, "raw bucket", p, st, body)

# --- writes: PutObject then GetObject returns the new bytes (cached pages invalidated)
old = local("objs/small.txt")
check(s3.get_object(Bucket="data", Key="objs/small.txt")["Body"].read() == old)
new = bytes(range(256)) * 4099
r = s3.put_object(Bucket="data", Key="objs/small.txt", Body=new)
check(status(r) == 200 and r["ETag"].startswith('"'))
got = s3.get_object(Bucket="data", Key="objs/small.txt")
check(got["Body"].read() == new and got["ContentLength"] == len(new), "new bytes at once")
check(got["ETag"] == r["ETag"], got["ETag"], r["ETag"])
check(local("objs/small.txt") == new, "written through to the store")
big = os.urandom(20 * 1024 * 1024 + 7)
s3.put_object(Bucket="data", Key="fresh/dir/big.bin", Body=big)
check(hashlib.sha256(s3.get_object(Bucket="data", Key="fresh/dir/big.bin")["Body"].read()).digest()
      == hashlib.sha256(big).digest(), "20 MiB put")
check(local("fresh/dir/big.bin") == big)
r = s3.list_objects_v2(Bucket="data", Prefix="fresh/")
check([o["Key"] for o in r["Contents"]] == ["fresh/dir/big.bin"], r.get("Contents"))
# A zero-byte directory marker is accepted and remembered by the gateway, not stored (the
# store's directories exist while they hold objects): it reads as an empty object and lists as
# a common prefix of its parent until it is deleted (s3fs-fuse's mkdir, pyarrow's create_dir);
# one with bytes is refused.
check(err(lambda: s3.head_object(Bucket="data", Key="fresh/marker/"))[0] == 404)
check(status(s3.put_object(Bucket="data", Key="fresh/marker/", Body=b"")) == 200)
check(not os.path.exists(os.path.join(DATA, "fresh/marker")))
h = s3.head_object(Bucket="data", Key="fresh/marker/")
check(h["ContentLength"] == 0 and h["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"', h)
check(s3.get_object(Bucket="data", Key="fresh/marker/")["Body"].read() == b"")
check(err(lambda: s3.head_object(Bucket="data", Key="fresh/marker"))[0] == 404, "no object without the /")
r = s3.list_objects_v2(Bucket="data", Prefix="fresh/", Delimiter="/")
check([p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["fresh/dir/", "fresh/marker/"], r)
check([o["Key"] for o in s3.list_objects_v2(Bucket="data", Prefix="fresh/")["Contents"]]
      == ["fresh/dir/big.bin"], "a marker is no key of a recursive listing")
check(status(s3.put_object(Bucket="data", Key="fresh/marker/in/", Body=b"")) == 200)
r = s3.list_objects_v2(Bucket="data", Prefix="fresh/marker/", Delimiter="/")
check([p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["fresh/marker/in/"], r)
check(err(lambda: s3.put_object(Bucket="data", Key="fresh/marker/", Body=b"x")) == (400, "InvalidArgument"))
s3.delete_object(Bucket="data", Key="fresh/marker/in/")
s3.delete_object(Bucket="data", Key="fresh/marker/")
check(err(lambda: s3.head_object(Bucket="data", Key="fresh/marker/"))[0] == 404, "deleted")
r = s3.list_objects_v2(Bucket="data", Prefix="fresh/", Delimiter="/")
check([p["Prefix"] for p in r.get("CommonPrefixes", [])] == ["fresh/dir/"], r)

# --- multipart: three parts, at least 5 MiB except the last
key = "mp/obj.bin"
uid = s3.create_multipart_upload(Bucket="data", Key=key)["UploadId"]
parts = [os.urandom(5 * 1024 * 1024), os.urandom(5 * 1024 * 1024 + 3), os.urandom(1234)]
etags = [s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=i + 1, Body=p)["ETag"]
         for i, p in enumerate(parts)]
check(not os.path.exists(os.path.join(DATA, key)), "nothing visible before completion")
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
      MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"bad"'}]})) == (400, "InvalidPart"))
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
      MultipartUpload={"Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]}))
      == (400, "InvalidPartOrder"))
r = s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid, MultipartUpload={
    "Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]})
check(r["ETag"].startswith('"'), r)
whole = b"".join(parts)
check(s3.get_object(Bucket="data", Key=key)["Body"].read() == whole, "multipart object")
check(local(key) == whole)
check(err(lambda: s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=4, Body=b"x"))
      == (404, "NoSuchUpload"))
uid = s3.create_multipart_upload(Bucket="data", Key="mp/small.bin")["UploadId"]
e1 = s3.upload_part(Bucket="data", Key="mp/small.bin", UploadId=uid, PartNumber=1, Body=b"a" * 100)["ETag"]
e2 = s3.upload_part(Bucket="data", Key="mp/small.bin", UploadId=uid, PartNumber=2, Body=b"b" * 100)["ETag"]
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key="mp/small.bin", UploadId=uid,
      MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]}))
      == (400, "EntityTooSmall"))
s3.abort_multipart_upload(Bucket="data", Key="mp/small.bin", UploadId=uid)
check(err(lambda: s3.abort_multipart_upload(Bucket="data", Key="mp/small.bin", UploadId=uid))
      == (404, "NoSuchUpload"))
check(not os.path.exists(os.path.join(DATA, "mp/small.bin")))

# --- delete
s3.delete_object(Bucket="data", Key="fresh/dir/big.bin")
check(err(lambda: s3.head_object(Bucket="data", Key="fresh/dir/big.bin"))[0] == 404)
check(not os.path.exists(os.path.join(DATA, "fresh/dir/big.bin")))
s3.delete_object(Bucket="data", Key="fresh/never-was")

# --- the --anonymous gateway: unsigned reads yes, unsigned writes no, signed reads as usual
anon = boto3.client("s3", endpoint_url=EP_ANON,
                    config=cfg.merge(Config(signature_version=botocore.UNSIGNED)))
check(anon.get_object(Bucket="data", Key="objs/a.bin", Range="bytes=0-99")["Body"].read() == a[:100])
check([o["Key"] for o in anon.list_objects_v2(Bucket="data", Prefix="tree/")["Contents"]] == sorted(TREE))
check(err(lambda: anon.put_object(Bucket="data", Key="objs/anon", Body=b"x")) == (403, "AccessDenied"))
check(not os.path.exists(os.path.join(DATA, "objs/anon")))
# An error answered to a request with a body (here before the body is read: an unsigned PUT)
# closes the connection: nobody knows how much of that body the client still sends (botocore
# sends it after waiting 1 s for "100 Continue"), so nothing more is read from it.
import socket
u = urllib.parse.urlparse(EP_ANON)
sock = socket.create_connection((u.hostname, u.port))
sock.sendall(b"PUT /data/objs/anon2 HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
             b"Content-Length: 5\r\n\r\nGET /")
f = sock.makefile("rb")
status = f.readline().split()
heads = {}
while True:
    line = f.readline()
    if line in (b"\r\n", b""):
        break
    k, v = line.decode().split(":", 1)
    heads[k.strip().lower()] = v.strip()
f.read(int(heads.get("content-length", "0")))
check(status[1] == b"403" and heads.get("connection") == "close", (status, heads))
check(f.read() == b"", "the connection ends after the answer")
sock.close()
check(not os.path.exists(os.path.join(DATA, "objs/anon2")))
signed = client(ep=EP_ANON)
check(signed.get_object(Bucket="data", Key="objs/a.bin")["Body"].read() == a)
check(err(lambda: client(ep=EP_ANON, secret="wrong").get_object(Bucket="data", Key="objs/a.bin"))[0] == 403)
# Started without --mount: read-only even for signed requests.
check(err(lambda: signed.put_object(Bucket="data", Key="objs/ro", Body=b"x")) == (501, "NotImplemented"))
check(err(lambda: signed.create_multipart_upload(Bucket="data", Key="objs/ro")) == (501, "NotImplemented"))
check(err(lambda: signed.delete_object(Bucket="data", Key="objs/a.bin")) == (501, "NotImplemented"))
check(not os.path.exists(os.path.join(DATA, "objs/ro")) and os.path.exists(os.path.join(DATA, "objs/a.bin")))
print("ALL OK")
"#;

/// Issue 16 with boto3: conditional requests (412/304), ETags in listings and of parts and
/// multipart objects, directory markers, deletes of directories and missing keys,
/// object/prefix conflicts (409), error bodies, idempotent completion, ListMultipartUploads,
/// CopyObject, UploadPartCopy, GetObjectAttributes, SSE refused, listing details.
const S3_RULES_SCRIPT: &str = r#"
import os, hashlib, datetime, http.client, urllib.parse
import boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

EP, KEY, SECRET, DATA = (os.environ[k] for k in ("EP", "KEY", "SECRET", "DATA"))
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
             region_name="us-east-1")
s3 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                  config=cfg)

def check(cond, *msg):
    if not cond:
        raise AssertionError(" ".join(map(str, msg)))

def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    raise AssertionError("expected an error")

def error_of(fn):
    try:
        fn()
    except ClientError as e:
        return e.response
    raise AssertionError("expected an error")

def status(r):
    return r["ResponseMetadata"]["HTTPStatusCode"]

def local(key):
    return open(os.path.join(DATA, key), "rb").read()

def raw(method, path, headers=None, body=b""):
    # A signed request sent as written (query included); returns (status, headers, body).
    u = urllib.parse.urlsplit(EP)
    req = AWSRequest(method=method, url=EP + path, data=body,
                     headers=dict(headers or {}, **{"x-amz-content-sha256": "UNSIGNED-PAYLOAD"}))
    S3SigV4Auth(Credentials(KEY, SECRET), "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request(method, path, body=body, headers=dict(req.headers.items()))
    resp = conn.getresponse()
    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()

head = lambda k, **kw: s3.head_object(Bucket="data", Key=k, **kw)
get = lambda k, **kw: s3.get_object(Bucket="data", Key=k, **kw)
put = lambda k, b, **kw: s3.put_object(Bucket="data", Key=k, Body=b, **kw)

# --- ETags in listings (v1 and v2) equal HEAD's
for key in ["objs/a.bin", "tree/a/x.bin", "readme.txt", "tree/top.txt"]:
    h = head(key)["ETag"]
    v2 = s3.list_objects_v2(Bucket="data", Prefix=key)["Contents"]
    v1 = s3.list_objects(Bucket="data", Prefix=key)["Contents"]
    check(v2[0]["Key"] == key and v2[0]["ETag"] == h, "v2 etag", key, v2[0], h)
    check(v1[0]["Key"] == key and v1[0]["ETag"] == h, "v1 etag", key, v1[0], h)
for o in s3.list_objects_v2(Bucket="data", Prefix="tree/")["Contents"]:
    check(o["ETag"] == head(o["Key"])["ETag"], "recursive listing etag", o)
for o in s3.list_objects_v2(Bucket="data", Prefix="tree/", Delimiter="/")["Contents"]:
    check(o["ETag"] == head(o["Key"])["ETag"], "delimited listing etag", o)
page = s3.list_objects_v2(Bucket="data", Prefix="big/", MaxKeys=1000)["Contents"]
check(len(page) == 1000 and all(o.get("ETag", "").startswith('"') for o in page), "big page etags")
check(page[123]["ETag"] == head(page[123]["Key"])["ETag"])

# --- PutObject: the ETag is the MD5 of the bytes (as S3's), in the answer, HEAD, GET and
# listings; also for a body over the gateway's 16 MiB write chunk (sent on as a multipart upload)
for key, body in [("md5/small.txt", b"small body\n"), ("md5/big.bin", os.urandom((16 << 20) + 12345))]:
    want = '"%s"' % hashlib.md5(body).hexdigest()
    check(put(key, body)["ETag"] == want, "put etag is the md5", key)
    check(head(key)["ETag"] == want and get(key)["ETag"] == want, "head/get etag is the md5", key)
    check(s3.list_objects_v2(Bucket="data", Prefix=key)["Contents"][0]["ETag"] == want, key)

# --- conditional GET and HEAD (S3's precedence: If-Match, then If-Unmodified-Since unless
# If-Match held; If-None-Match, then If-Modified-Since unless If-None-Match was given)
h = head("objs/a.bin")
etag, lm = h["ETag"], h["LastModified"]
day = datetime.timedelta(days=1)
check(status(get("objs/a.bin", IfMatch=etag)) == 200)
check(err(lambda: get("objs/a.bin", IfMatch='"nope"')) == (412, "PreconditionFailed"))
check(status(get("objs/a.bin", IfNoneMatch='"nope"')) == 200)
check(err(lambda: get("objs/a.bin", IfNoneMatch=etag))[0] == 304)
check(err(lambda: get("objs/a.bin", IfNoneMatch="*"))[0] == 304)
check(err(lambda: get("objs/a.bin", IfModifiedSince=lm))[0] == 304)
check(status(get("objs/a.bin", IfModifiedSince=lm - day)) == 200)
check(status(get("objs/a.bin", IfUnmodifiedSince=lm)) == 200)
check(err(lambda: get("objs/a.bin", IfUnmodifiedSince=lm - day)) == (412, "PreconditionFailed"))
check(status(get("objs/a.bin", IfMatch=etag, IfUnmodifiedSince=lm - day)) == 200, "If-Match wins")
check(status(get("objs/a.bin", IfNoneMatch='"nope"', IfModifiedSince=lm + day)) == 200, "If-None-Match wins")
check(err(lambda: get("objs/a.bin", IfMatch='"nope"', IfNoneMatch=etag))[0] == 412, "412 before 304")
check(err(lambda: head("objs/a.bin", IfNoneMatch=etag))[0] == 304)
check(err(lambda: head("objs/a.bin", IfMatch='"nope"'))[0] == 412)
check(err(lambda: head("objs/a.bin", IfModifiedSince=lm))[0] == 304)
check(err(lambda: head("objs/a.bin", IfUnmodifiedSince=lm - day))[0] == 412)
check(status(head("objs/a.bin", IfNoneMatch='"nope"', IfMatch=etag)) == 200)
st, hd, body = raw("GET", "/data/objs/a.bin", {"If-None-Match": etag})
check(st == 304 and body == b"" and hd.get("etag") == etag, "raw 304", st, hd, body[:100])

# --- PUT If-None-Match: * (create only) and If-Match (compare and swap)
check(status(put("cond/lock", b"one", IfNoneMatch="*")) == 200)
check(err(lambda: put("cond/lock", b"two", IfNoneMatch="*")) == (412, "PreconditionFailed"))
check(local("cond/lock") == b"one", "create-only put must not overwrite")
e1 = head("cond/lock")["ETag"]
r = put("cond/lock", b"two", IfMatch=e1)
e2 = r["ETag"]
check(status(r) == 200 and e2 != e1 and head("cond/lock")["ETag"] == e2)
check(get("cond/lock")["Body"].read() == b"two")
check(err(lambda: put("cond/lock", b"three", IfMatch=e1)) == (412, "PreconditionFailed"))
check(local("cond/lock") == b"two")
check(err(lambda: put("cond/never", b"x", IfMatch=e1)) == (404, "NoSuchKey"))
check(not os.path.exists(os.path.join(DATA, "cond/never")))
check(err(lambda: put("cond/lock", b"x", IfNoneMatch=e2)) == (501, "NotImplemented"))
big = os.urandom(17 * 1024 * 1024)
check(status(put("cond/big", big, IfNoneMatch="*")) == 200, "large create-only put")
check(err(lambda: put("cond/big", b"small", IfNoneMatch="*"))[0] == 412)
check(local("cond/big") == big)

# --- parts: ETag = MD5 of the part; object: md5-of-md5s-N, same on HEAD, GET and listings
def mp(key, parts, **kw):
    uid = s3.create_multipart_upload(Bucket="data", Key=key)["UploadId"]
    tags = []
    for i, p in enumerate(parts):
        t = s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=i + 1, Body=p)["ETag"]
        check(t == '"%s"' % hashlib.md5(p).hexdigest(), "part etag is its md5", t)
        tags.append(t)
    return uid, {"Parts": [{"PartNumber": i + 1, "ETag": t} for i, t in enumerate(tags)]}

parts = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
want = '"%s-2"' % hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
uid, body = mp("cond/mp.bin", parts)
r = s3.complete_multipart_upload(Bucket="data", Key="cond/mp.bin", UploadId=uid,
                                 MultipartUpload=body, IfNoneMatch="*")
check(r["ETag"] == want, "multipart etag", r["ETag"], want)
check(head("cond/mp.bin")["ETag"] == want and get("cond/mp.bin")["ETag"] == want)
check(s3.list_objects_v2(Bucket="data", Prefix="cond/mp.bin")["Contents"][0]["ETag"] == want)
check(get("cond/mp.bin")["Body"].read() == b"".join(parts))
check(status(get("cond/mp.bin", IfMatch=want)) == 200)
# A retry of the completion (its answer lost) answers the same.
r2 = s3.complete_multipart_upload(Bucket="data", Key="cond/mp.bin", UploadId=uid, MultipartUpload=body)
check(status(r2) == 200 and r2["ETag"] == want, "idempotent completion", r2)
a = s3.get_object_attributes(Bucket="data", Key="cond/mp.bin", ObjectAttributes=["ETag", "ObjectSize"])
check(a["ObjectSize"] == sum(map(len, parts)), a)
check(a["ETag"] == want.strip('"'), "GetObjectAttributes gives the ETag unquoted, as S3", a)
uid, body = mp("cond/mp.bin", [b"z" * 100])
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key="cond/mp.bin", UploadId=uid,
      MultipartUpload=body, IfNoneMatch="*")) == (412, "PreconditionFailed"))
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key="cond/mp.bin", UploadId=uid,
      MultipartUpload=body, IfMatch='"nope"')) == (412, "PreconditionFailed"))
check(get("cond/mp.bin")["Body"].read() == b"".join(parts), "a refused completion writes nothing")
r = s3.complete_multipart_upload(Bucket="data", Key="cond/mp.bin", UploadId=uid,
                                 MultipartUpload=body, IfMatch=want)
check(get("cond/mp.bin")["Body"].read() == b"z" * 100 and head("cond/mp.bin")["ETag"] == r["ETag"])

# --- ListMultipartUploads
uid = s3.create_multipart_upload(Bucket="data", Key="cond/open.bin")["UploadId"]
ups = s3.list_multipart_uploads(Bucket="data", Prefix="cond/").get("Uploads", [])
check([(u["Key"], u["UploadId"]) for u in ups] == [("cond/open.bin", uid)], ups)
# --- ListParts
for n, b in [(1, b"p1" * 10), (3, b"p3")]:
    s3.upload_part(Bucket="data", Key="cond/open.bin", UploadId=uid, PartNumber=n, Body=b)
lp = s3.list_parts(Bucket="data", Key="cond/open.bin", UploadId=uid)
check([(p["PartNumber"], p["Size"], p["ETag"]) for p in lp["Parts"]] ==
      [(1, 20, '"%s"' % hashlib.md5(b"p1" * 10).hexdigest()), (3, 2, '"%s"' % hashlib.md5(b"p3").hexdigest())], lp)
lp = s3.list_parts(Bucket="data", Key="cond/open.bin", UploadId=uid, MaxParts=1)
check(lp["IsTruncated"] and [p["PartNumber"] for p in lp["Parts"]] == [1], lp)
lp = s3.list_parts(Bucket="data", Key="cond/open.bin", UploadId=uid, PartNumberMarker=lp["NextPartNumberMarker"])
check(not lp["IsTruncated"] and [p["PartNumber"] for p in lp["Parts"]] == [3], lp)
check(err(lambda: s3.list_parts(Bucket="data", Key="cond/open.bin", UploadId="nope")) == (404, "NoSuchUpload"))
check(s3.list_multipart_uploads(Bucket="data", Prefix="objs/").get("Uploads", []) == [])
s3.abort_multipart_upload(Bucket="data", Key="cond/open.bin", UploadId=uid)
check(s3.list_multipart_uploads(Bucket="data").get("Uploads", []) == [])

# --- DELETE and DeleteObjects with If-Match
e = head("cond/lock")["ETag"]
check(err(lambda: s3.delete_object(Bucket="data", Key="cond/lock", IfMatch='"nope"')) == (412, "PreconditionFailed"))
check(os.path.exists(os.path.join(DATA, "cond/lock")))
check(status(s3.delete_object(Bucket="data", Key="cond/lock", IfMatch=e)) == 204)
check(not os.path.exists(os.path.join(DATA, "cond/lock")))
put("cond/d1", b"1"); put("cond/d2", b"2")
r = s3.delete_objects(Bucket="data", Delete={"Objects": [
    {"Key": "cond/d1", "ETag": '"nope"'}, {"Key": "cond/d2", "ETag": head("cond/d2")["ETag"]}]})
check([x["Key"] for x in r.get("Deleted", [])] == ["cond/d2"], r)
check([(x["Key"], x["Code"]) for x in r.get("Errors", [])] == [("cond/d1", "PreconditionFailed")], r)
check(os.path.exists(os.path.join(DATA, "cond/d1")) and not os.path.exists(os.path.join(DATA, "cond/d2")))

# --- directory markers, deletes of directories and missing keys
r = put("cond/dir/", b"")
check(status(r) == 200 and r["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"', r)
check(status(s3.delete_object(Bucket="data", Key="tree/b")) == 204, "a directory's name")
check(os.path.exists(os.path.join(DATA, "tree/b/c/d/e.bin")))
check(status(s3.delete_object(Bucket="data", Key="cond/missing")) == 204)
check(status(s3.delete_object(Bucket="data", Key="cond/dir/")) == 204)

# --- object/prefix conflicts: 409, without server paths; errors carry a RequestId
for key in ["tree/a", "objs/empty/x"]:
    e = error_of(lambda: put(key, b"x"))
    check(e["ResponseMetadata"]["HTTPStatusCode"] == 409, key, e)
    check(DATA not in e["Error"].get("Message", ""), "server path in", e)
    check(e["ResponseMetadata"].get("RequestId"), "RequestId", e)
st, hd, body = raw("PUT", "/data/tree/a", body=b"x")
check(st == 409 and b"<RequestId>" in body and DATA.encode() not in body, st, body)
check(hd.get("x-amz-request-id") and hd["x-amz-request-id"].encode() in body, hd, body)

# --- CopyObject (through the store's copy, the destination's cached pages invalidated)
a = local("objs/a.bin")
check(get("objs/a.bin")["Body"].read() == a)
put("cond/copy.bin", b"old bytes")
check(get("cond/copy.bin")["Body"].read() == b"old bytes")
r = s3.copy_object(Bucket="data", Key="cond/copy.bin", CopySource={"Bucket": "data", "Key": "objs/a.bin"})
check(r["CopyObjectResult"]["ETag"] == head("cond/copy.bin")["ETag"], r)
check(get("cond/copy.bin")["Body"].read() == a and local("cond/copy.bin") == a, "copied bytes")
check(err(lambda: s3.copy_object(Bucket="data", Key="cond/copy2.bin", CopySource={"Bucket": "data", "Key": "objs/a.bin"},
      CopySourceIfMatch='"nope"')) == (412, "PreconditionFailed"))
check(err(lambda: s3.copy_object(Bucket="data", Key="cond/copy2.bin", CopySource={"Bucket": "data", "Key": "objs/nope"}))[0] == 404)
# onto itself without new metadata: refused as S3 refuses it, nothing changes
check(err(lambda: s3.copy_object(Bucket="data", Key="cond/copy.bin",
      CopySource={"Bucket": "data", "Key": "cond/copy.bin"})) == (400, "InvalidRequest"))
check(local("cond/copy.bin") == a)
# UploadPartCopy: a range of the 17 MiB object, then all of a.bin
uid = s3.create_multipart_upload(Bucket="data", Key="cond/upc.bin")["UploadId"]
cut = 5 * 1024 * 1024
p1 = s3.upload_part_copy(Bucket="data", Key="cond/upc.bin", UploadId=uid, PartNumber=1,
                         CopySource={"Bucket": "data", "Key": "cond/big"}, CopySourceRange="bytes=100-%d" % (cut + 99))
p2 = s3.upload_part_copy(Bucket="data", Key="cond/upc.bin", UploadId=uid, PartNumber=2,
                         CopySource={"Bucket": "data", "Key": "objs/a.bin"})
check(p1["CopyPartResult"]["ETag"] == '"%s"' % hashlib.md5(big[100:cut + 100]).hexdigest(), p1)
check(err(lambda: s3.upload_part_copy(Bucket="data", Key="cond/upc.bin", UploadId=uid, PartNumber=3,
      CopySource={"Bucket": "data", "Key": "objs/a.bin"}, CopySourceRange="bytes=0-%d" % len(a))) == (416, "InvalidRange"))
check(err(lambda: s3.upload_part_copy(Bucket="data", Key="cond/upc.bin", UploadId=uid, PartNumber=3,
      CopySource={"Bucket": "data", "Key": "objs/a.bin"}, CopySourceRange="bytes=5-4"))[0] == 400)
s3.complete_multipart_upload(Bucket="data", Key="cond/upc.bin", UploadId=uid, MultipartUpload={"Parts": [
    {"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]}]})
check(get("cond/upc.bin")["Body"].read() == big[100:cut + 100] + a, "UploadPartCopy")

# --- GetObjectAttributes
at = s3.get_object_attributes(Bucket="data", Key="objs/a.bin", ObjectAttributes=["ETag", "ObjectSize", "StorageClass"])
check(at["ObjectSize"] == len(a) and at["ETag"] == head("objs/a.bin")["ETag"].strip('"'), at)
check(err(lambda: s3.get_object_attributes(Bucket="data", Key="objs/nope", ObjectAttributes=["ETag"]))[0] == 404)

# --- server-side encryption: refused, nothing written
for kw in [dict(ServerSideEncryption="AES256"), dict(ServerSideEncryption="aws:kms", SSEKMSKeyId="k"),
           dict(SSECustomerAlgorithm="AES256", SSECustomerKey="k" * 32)]:
    check(err(lambda: put("cond/sse", b"secret", **kw)) == (501, "NotImplemented"), kw)
    check(err(lambda: s3.create_multipart_upload(Bucket="data", Key="cond/sse", **kw)) == (501, "NotImplemented"), kw)
check(not os.path.exists(os.path.join(DATA, "cond/sse")))
e = error_of(lambda: put("cond/sse", b"secret", ServerSideEncryption="AES256"))
check("encryption" in e["Error"]["Message"], e)

# --- attributes: Content-Type, Cache-Control, Content-Disposition, Content-Language and user
# metadata kept with the object (file:// mounts: in a user extended attribute of the file)
probe = os.path.join(DATA, "xattr-probe")
open(probe, "wb").close()
try:
    os.setxattr(probe, "user.probe", b"x")
    xattrs = True
except OSError:
    xattrs = False
os.remove(probe)
kept = dict(ContentType="text/csv", CacheControl="max-age=60", ContentLanguage="en",
            ContentDisposition='attachment; filename="a.csv"')
put("attr/a.csv", b"x,y\n", Metadata={"mtime": "1700000000", "Owner": "me"}, **kept)
check(local("attr/a.csv") == b"x,y\n")
if xattrs:
    for r in [head("attr/a.csv"), get("attr/a.csv")]:
        check(all(r.get(k) == v for k, v in kept.items()), "attributes", r)
        check(r["Metadata"] == {"mtime": "1700000000", "owner": "me"}, r["Metadata"])
    check(get("attr/a.csv", ResponseContentType="application/json")["ContentType"] == "application/json")
    s3.copy_object(Bucket="data", Key="attr/b.csv", CopySource={"Bucket": "data", "Key": "attr/a.csv"})
    h = head("attr/b.csv")
    check(h["ContentType"] == "text/csv" and h["Metadata"]["mtime"] == "1700000000", "copy keeps attributes", h)
    s3.copy_object(Bucket="data", Key="attr/b.csv", CopySource={"Bucket": "data", "Key": "attr/b.csv"},
                   MetadataDirective="REPLACE", ContentType="text/plain", Metadata={"k": "v"})
    h = head("attr/b.csv")
    check(h["ContentType"] == "text/plain" and h["Metadata"] == {"k": "v"} and "CacheControl" not in h,
          "copy onto itself with REPLACE", h)
    check(get("attr/b.csv")["Body"].read() == b"x,y\n")
    uid = s3.create_multipart_upload(Bucket="data", Key="attr/mp.bin", ContentType="image/png",
                                     Metadata={"m": "1"})["UploadId"]
    t = s3.upload_part(Bucket="data", Key="attr/mp.bin", UploadId=uid, PartNumber=1, Body=b"png")["ETag"]
    s3.complete_multipart_upload(Bucket="data", Key="attr/mp.bin", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": t}]})
    h = head("attr/mp.bin")
    check(h["ContentType"] == "image/png" and h["Metadata"] == {"m": "1"}, "multipart attributes", h)
else:
    check(head("attr/a.csv")["ContentType"] == "application/octet-stream")
check(err(lambda: put("attr/big", b"x", Metadata={"k": "v" * 3000})) == (400, "MetadataTooLarge"))
check(not os.path.exists(os.path.join(DATA, "attr/big")))

# --- listing details
st, _, body = raw("GET", "/data?list-type=2&prefix=tree%2F&delimiter=")
check(st == 200 and b"<Delimiter" not in body and body.count(b"<Key>") == 6, "empty delimiter", body[:400])
st, _, body = raw("GET", "/data?list-type=2&prefix=tree%2F&continuation-token=")
check(st == 200 and body.count(b"<Key>") == 6, "empty continuation token", st, body[:400])
st, _, body = raw("GET", "/data?prefix=objs%2Fwith%20&encoding-type=url")
check(st == 200 and b"<Prefix>objs/with </Prefix>" in body and b"<Key>objs/with%20space%2Bplus.txt</Key>" in body,
      "v1 url encoding", body)
check([b["Name"] for b in s3.list_buckets(MaxBuckets=1)["Buckets"]] == ["data"])
check("ContinuationToken" not in s3.list_buckets(MaxBuckets=1))
check(s3.list_buckets(Prefix="zz").get("Buckets", []) == [])

# --- delimiters other than "/": keys rolled up to the first delimiter after the prefix
def listing(fn, **kw):
    keys, prefixes = [], []
    for page in s3.get_paginator(fn).paginate(Bucket="data", Prefix="tree/", **kw):
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return keys, prefixes
tree = ["tree/a-b.txt", "tree/a/x.bin", "tree/a/y/z.bin", "tree/a0.txt", "tree/b/c/d/e.bin", "tree/top.txt"]
others = [t for t in tree if t != "tree/a-b.txt"]
for fn in ["list_objects_v2", "list_objects"]:
    for size in [1000, 1, 2]:
        got = listing(fn, Delimiter="-", PaginationConfig={"PageSize": size})
        check(got == (others, ["tree/a-"]), fn, size, got)
        got = listing(fn, Delimiter="a", PaginationConfig={"PageSize": size})
        check(got == (["tree/b/c/d/e.bin", "tree/top.txt"], ["tree/a"]), fn, size, got)
        got = listing(fn, Delimiter="/d/", PaginationConfig={"PageSize": size})
        check(got == ([t for t in tree if "/d/" not in t], ["tree/b/c/d/"]), fn, size, got)
# --- owners: v1 always, v2 with fetch-owner
r = s3.list_objects_v2(Bucket="data", Prefix="tree/", FetchOwner=True)["Contents"]
check(len(r) == 6 and all(o["Owner"]["ID"] == "pagestore" for o in r), r)
check(all("Owner" not in o for o in s3.list_objects_v2(Bucket="data", Prefix="tree/")["Contents"]))
check(all("Owner" in o for o in s3.list_objects(Bucket="data", Prefix="tree/")["Contents"]))
check(s3.list_objects_v2(Bucket="data", Prefix="tree/", ContinuationToken="")["ContinuationToken"] == "")

# --- CreateBucket and DeleteBucket: buckets are the cluster's top-level directories
check(status(s3.create_bucket(Bucket="data")) == 200)
check(err(lambda: s3.create_bucket(Bucket="no-such-mount")) == (501, "NotImplemented"))
check(err(lambda: s3.create_bucket(Bucket="a")) == (400, "InvalidBucketName"))
check(err(lambda: s3.delete_bucket(Bucket="no-such-mount")) == (404, "NoSuchBucket"))
check(err(lambda: s3.delete_bucket(Bucket="data")) == (409, "BucketNotEmpty"))

# --- a key written where a directory of deleted keys stayed behind on disk takes its place
put("cond/gone/x", b"x")
s3.delete_object(Bucket="data", Key="cond/gone/x")
check(os.path.isdir(os.path.join(DATA, "cond/gone")))
check(status(put("cond/gone", b"a file now")) == 200 and local("cond/gone") == b"a file now")
check(get("cond/gone")["Body"].read() == b"a file now")

# --- partNumber: an object written in one piece is one part: part 1 is all of it, no other
check(get("cond/gone", PartNumber=1)["Body"].read() == b"a file now")
check(head("cond/gone", PartNumber=1)["ContentLength"] == len(b"a file now"))
check(err(lambda: get("cond/gone", PartNumber=2)) == (400, "InvalidPart"))
check(err(lambda: head("cond/gone", PartNumber=2))[0] == 400)

# --- multipart checksums (COMPOSITE: of the parts' checksums) and reads of one part. Part
# numbers 1, 3 and 7: a part keeps its number. The parts name no checksum: the gateway
# computes the upload's algorithm for each.
import base64, zlib
b64 = lambda d: base64.b64encode(d).decode()
sha = lambda d: hashlib.sha256(d).digest()
key = "sums/composite.bin"
r = s3.create_multipart_upload(Bucket="data", Key=key, ChecksumAlgorithm="SHA256")
check(r["ChecksumAlgorithm"] == "SHA256" and r["ChecksumType"] == "COMPOSITE", r)
uid = r["UploadId"]
parts = {1: os.urandom(5 * 1024 * 1024), 3: os.urandom(5 * 1024 * 1024 + 3), 7: os.urandom(1234)}
listed = []
for n, p in parts.items():
    r = s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=n, Body=p)
    check(r["ChecksumSHA256"] == b64(sha(p)), "the part's checksum by the upload's algorithm", n, r)
    listed.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumSHA256": r["ChecksumSHA256"]})
lp = s3.list_parts(Bucket="data", Key=key, UploadId=uid)["Parts"]
check([p.get("ChecksumSHA256") for p in lp] == [b64(sha(p)) for p in parts.values()], lp)
composite = b64(sha(b"".join(sha(p) for p in parts.values()))) + "-3"
# A part checksum or an object checksum that does not match: refused, nothing written.
wrong = [dict(listed[0], ChecksumSHA256=b64(sha(b"other")))] + listed[1:]
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
      MultipartUpload={"Parts": wrong})) == (400, "InvalidPart"))
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
      MultipartUpload={"Parts": listed}, ChecksumSHA256=b64(sha(b"other")) + "-3")) == (400, "BadDigest"))
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
      MultipartUpload={"Parts": listed}, ChecksumCRC32="AAAAAA==")) == (400, "InvalidArgument"))
check(not os.path.exists(os.path.join(DATA, key)), "a refused completion writes nothing")
r = s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
                                 MultipartUpload={"Parts": listed}, ChecksumSHA256=composite)
check(r["ChecksumSHA256"] == composite and r["ChecksumType"] == "COMPOSITE", r)
etag = r["ETag"]
check(local(key) == b"".join(parts.values()))
h = head(key, ChecksumMode="ENABLED")
check(h["ChecksumSHA256"] == composite and h["ChecksumType"] == "COMPOSITE", h)
check("ChecksumSHA256" not in head(key), "checksums only when asked")
start = 0
for n, p in parts.items():
    g = get(key, PartNumber=n, ChecksumMode="ENABLED")
    check(g["Body"].read() == p and g["PartsCount"] == 3 and g["ETag"] == etag, "part", n)
    check(g["ContentRange"] == "bytes %d-%d/%d" % (start, start + len(p) - 1, len(local(key))), g)
    check(g["ChecksumSHA256"] == b64(sha(p)), "the part's checksum", n)
    h = head(key, PartNumber=n)
    check(h["ContentLength"] == len(p) and h["PartsCount"] == 3, "head of part", n, h)
    start += len(p)
for n in (2, 8, 10000):
    check(err(lambda: get(key, PartNumber=n)) == (400, "InvalidPart"), "no part", n)
check(err(lambda: get(key, PartNumber=1, Range="bytes=0-9"))[0] == 400, "a Range and a part")
a = s3.get_object_attributes(Bucket="data", Key=key, ObjectAttributes=["ObjectParts", "Checksum"],
                             MaxParts=1, PartNumberMarker=1)
op = a["ObjectParts"]
check(op["TotalPartsCount"] == 3 and op["IsTruncated"] and op["NextPartNumberMarker"] == 3, a)
check([(p["PartNumber"], p["Size"], p["ChecksumSHA256"]) for p in op["Parts"]]
      == [(3, len(parts[3]), b64(sha(parts[3])))], a)
check(a["Checksum"]["ChecksumSHA256"] == composite and a["Checksum"]["ChecksumType"] == "COMPOSITE", a)

# A staged part damaged on the gateway's disk after its upload (one byte flipped, or cut short):
# the completion is refused and nothing is written; uploaded again, the part completes.
key = "sums/staged.bin"
uid = s3.create_multipart_upload(Bucket="data", Key=key)["UploadId"]
ps = [os.urandom(5 * 1024 * 1024), os.urandom(1000)]
tags = [s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=i + 1, Body=p)["ETag"]
        for i, p in enumerate(ps)]
listed = {"Parts": [{"PartNumber": i + 1, "ETag": t} for i, t in enumerate(tags)]}
staged = [os.path.join(os.environ["STAGING"], "upload-" + uid, "part-%05d" % (i + 1)) for i in range(2)]
with open(staged[0], "r+b") as f:
    f.seek(12345)
    b = f.read(1)
    f.seek(12345)
    f.write(bytes([b[0] ^ 1]))
with open(staged[1], "r+b") as f:
    f.truncate(999)
for damaged, again in ((0, ps[0]), (1, ps[1])):
    r = error_of(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
                                                      MultipartUpload=listed))
    check(r["ResponseMetadata"]["HTTPStatusCode"] == 400 and r["Error"]["Code"] == "InvalidPart"
          and "part %d:" % (damaged + 1) in r["Error"]["Message"], damaged, r)
    check(not os.path.exists(os.path.join(DATA, key)), "nothing written from a damaged part")
    s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=damaged + 1, Body=again)
s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid, MultipartUpload=listed)
check(local(key) == b"".join(ps))

# An upload of one empty part: its part 1 is empty (no range to give).
uid = s3.create_multipart_upload(Bucket="data", Key="sums/empty.bin")["UploadId"]
t = s3.upload_part(Bucket="data", Key="sums/empty.bin", UploadId=uid, PartNumber=1, Body=b"")["ETag"]
s3.complete_multipart_upload(Bucket="data", Key="sums/empty.bin", UploadId=uid,
                             MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": t}]})
g = get("sums/empty.bin", PartNumber=1)
check(g["Body"].read() == b"" and g["PartsCount"] == 1 and status(g) == 200 and "ContentRange" not in g, g)
check(head("sums/empty.bin", PartNumber=1)["ContentLength"] == 0)

# FULL_OBJECT (CRC32): the checksum of the bytes, computed while they are sent, checked before
# the object is committed; a refused completion can be completed again.
key = "sums/full.bin"
r = s3.create_multipart_upload(Bucket="data", Key=key, ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT")
check(r["ChecksumType"] == "FULL_OBJECT", r)
uid = r["UploadId"]
ps = [os.urandom(5 * 1024 * 1024), os.urandom(777)]
listed = [{"PartNumber": i + 1, "ETag": s3.upload_part(Bucket="data", Key=key, UploadId=uid,
          PartNumber=i + 1, Body=p)["ETag"]} for i, p in enumerate(ps)]
crc = lambda d: b64((zlib.crc32(d) & 0xffffffff).to_bytes(4, "big"))
check(err(lambda: s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
      MultipartUpload={"Parts": listed}, ChecksumCRC32=crc(b"other"))) == (400, "BadDigest"))
check(not os.path.exists(os.path.join(DATA, key)), "a wrong whole-object checksum writes nothing")
r = s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid,
                                 MultipartUpload={"Parts": listed}, ChecksumCRC32=crc(b"".join(ps)))
check(r["ChecksumCRC32"] == crc(b"".join(ps)) and r["ChecksumType"] == "FULL_OBJECT", r)
check(head(key, ChecksumMode="ENABLED")["ChecksumCRC32"] == crc(b"".join(ps)))
check(local(key) == b"".join(ps))
# What S3 refuses at creation: no FULL_OBJECT of SHA-256, no COMPOSITE of CRC64NVME, no type
# without an algorithm.
for kw in ({"ChecksumAlgorithm": "SHA256", "ChecksumType": "FULL_OBJECT"},
           {"ChecksumAlgorithm": "CRC64NVME", "ChecksumType": "COMPOSITE"},
           {"ChecksumType": "COMPOSITE"}):
    check(err(lambda: s3.create_multipart_upload(Bucket="data", Key=key, **kw))[0] == 400, kw)
r = s3.create_multipart_upload(Bucket="data", Key=key, ChecksumAlgorithm="CRC64NVME")
check(r["ChecksumType"] == "FULL_OBJECT", "CRC64NVME has no composite form", r)
s3.abort_multipart_upload(Bucket="data", Key=key, UploadId=r["UploadId"])
print("ALL OK")
"#;

/// Issue 16 with the AWS CLI, s3cmd and pyarrow's own S3 file system.
const CLIENTS_SCRIPT: &str = r#"
import os, subprocess, hashlib, tempfile, time
import pyarrow.fs as pafs
EP, KEY, SECRET, DATA, BIN = (os.environ[k] for k in ("EP", "KEY", "SECRET", "DATA", "BIN"))

def check(cond, *msg):
    if not cond:
        raise AssertionError(" ".join(map(str, msg)))

def run(*args, env=None):
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    check(p.returncode == 0, args, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p.stdout

def local(key):
    return open(os.path.join(DATA, key), "rb").read()

work = tempfile.mkdtemp()
src = os.path.join(work, "src")
files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(70000), "sub/deeper/c.txt": b"c" * 10}
for rel, b in files.items():
    os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
    open(os.path.join(src, rel), "wb").write(b)

# --- AWS CLI: sync up twice; the second uploads nothing.
env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1",
           AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.path.join(work, "none"),
           AWS_SHARED_CREDENTIALS_FILE=os.path.join(work, "none"))
# sync compares sizes and times: an object's Last-Modified is its time in the store, newer than
# the file it was uploaded from, so the second sync has nothing to do.
aws = [os.path.join(BIN, "aws"), "--endpoint-url", EP]
out = run(*aws, "s3", "sync", src, "s3://data/awscli/", env=env)
check(out.count("upload:") == 3, "first sync", out)
for rel, b in files.items():
    check(local("awscli/" + rel) == b, rel)
out = run(*aws, "s3", "sync", src, "s3://data/awscli/", env=env)
check("upload:" not in out, "second sync uploaded again", out)
out = run(*aws, "s3", "ls", "--recursive", "s3://data/awscli/", env=env)
check(out.count("\n") == 3, out)
run(*aws, "s3", "cp", "s3://data/awscli/a.txt", "s3://data/awscli/copy.txt", env=env)
check(local("awscli/copy.txt") == b"alpha\n", "aws s3 cp between keys")
run(*aws, "s3", "rm", "--recursive", "s3://data/awscli/", env=env)
p = subprocess.run(aws + ["s3", "ls", "--recursive", "s3://data/awscli/"], capture_output=True, text=True, env=env)
# The AWS CLI exits 1 when a listing finds nothing.
check(p.returncode in (0, 1) and p.stdout.strip() == "", "after rm --recursive", p.returncode, p.stdout, p.stderr)

# --- s3cmd: sync (needs listing ETags) and a 30 MB multipart put (needs part MD5s)
host = EP.split("://", 1)[1]
cfg = os.path.join(work, "s3cfg")
open(cfg, "w").write("[default]\naccess_key = %s\nsecret_key = %s\nhost_base = %s\nhost_bucket = %s\n"
                     "use_https = False\nsignature_v2 = False\nbucket_location = us-east-1\n"
                     "check_ssl_certificate = False\n" % (KEY, SECRET, host, host))
s3cmd = [os.path.join(BIN, "python"), os.path.join(BIN, "s3cmd"), "-c", cfg]
out = run(*s3cmd, "sync", src + "/", "s3://data/s3cmd/")
for rel, b in files.items():
    check(local("s3cmd/" + rel) == b, "s3cmd sync", rel)
out = run(*s3cmd, "sync", src + "/", "s3://data/s3cmd/")
check("upload:" not in out, "s3cmd second sync uploaded again", out)
big = os.path.join(work, "big.bin")
open(big, "wb").write(os.urandom(30 * 1000 * 1000))
run(*s3cmd, "put", "--multipart-chunk-size-mb=5", big, "s3://data/s3cmd/big.bin")
check(hashlib.sha256(local("s3cmd/big.bin")).digest() == hashlib.sha256(open(big, "rb").read()).digest(), "s3cmd multipart put")
dst = os.path.join(work, "got")
os.makedirs(dst)
run(*s3cmd, "get", "--recursive", "s3://data/s3cmd/sub/", dst + "/")
check(open(os.path.join(dst, "b.bin"), "rb").read() == files["sub/b.bin"], "s3cmd wildcard get", os.listdir(dst))
# s3cmd as `s3cmd --configure` leaves it: it signs for the region "US" until told the right one
# (400 AuthorizationHeaderMalformed with <Region>, as S3 answers), then works.
cfg_us = os.path.join(work, "s3cfg-us")
open(cfg_us, "w").write("[default]\naccess_key = %s\nsecret_key = %s\nhost_base = %s\nhost_bucket = %s\n"
                        "use_https = False\nsignature_v2 = False\nbucket_location = US\n" % (KEY, SECRET, host, host))
s3cmd_us = [os.path.join(BIN, "python"), os.path.join(BIN, "s3cmd"), "-c", cfg_us]
check("s3://data" in run(*s3cmd_us, "ls", "s3://"), "s3cmd ls with region US")
run(*s3cmd_us, "put", os.path.join(src, "a.txt"), "s3://data/s3cmd-us/a.txt")
check(local("s3cmd-us/a.txt") == files["a.txt"], "s3cmd put with region US")

# --- pyarrow's S3 file system: create_dir, copy_file, delete_dir_contents
fs = pafs.S3FileSystem(access_key=KEY, secret_key=SECRET, endpoint_override=host, scheme="http",
                       region="us-east-1")
fs.create_dir("data/pa/dir")
with fs.open_output_stream("data/pa/dir/f.txt") as f:
    f.write(b"pyarrow\n")
fs.copy_file("data/pa/dir/f.txt", "data/pa/copy.txt")
check(local("pa/copy.txt") == b"pyarrow\n", "pyarrow copy_file")
fs.move("data/pa/copy.txt", "data/pa/moved.txt")
check(local("pa/moved.txt") == b"pyarrow\n" and not os.path.exists(os.path.join(DATA, "pa/copy.txt")))
fs.delete_dir_contents("data/pa/dir")
check(not os.path.exists(os.path.join(DATA, "pa/dir/f.txt")), "pyarrow delete_dir_contents")
fs.delete_file("data/pa/moved.txt")
check(not os.path.exists(os.path.join(DATA, "pa/moved.txt")))

# --- fsspec's s3fs: rm(recursive=True) of a tree (objects, then the directories' markers)
import s3fs
sfs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": EP})
for rel in ["rm/a.txt", "rm/x/b.txt", "rm/x/y/c.txt"]:
    sfs.pipe_file("data/" + rel, b"bytes of " + rel.encode())
check(sfs.cat_file("data/rm/x/y/c.txt") == b"bytes of rm/x/y/c.txt")
sfs.rm("data/rm", recursive=True)
sfs.invalidate_cache()
for rel in ["rm/a.txt", "rm/x/b.txt", "rm/x/y/c.txt"]:
    check(not sfs.isfile("data/" + rel), rel)
# The emptied directories stay on the file system, hidden from listings.
check(sfs.find("data/rm") == [], sfs.find("data/rm"))
check(not any(os.path.isfile(os.path.join(r, f)) for r, _, fs_ in os.walk(os.path.join(DATA, "rm")) for f in fs_))

# --- rclone: copy up twice (the second copies nothing: sizes and times kept), then check with
# hashes (ETags are the MD5 of what this gateway wrote).
import shutil
rc = shutil.which("rclone")
check(rc, "rclone is not installed (apt-get install rclone)")
renv = dict(os.environ, RCLONE_CONFIG=os.path.join(work, "rclone.conf"), RCLONE_CONFIG_PS_TYPE="s3",
            RCLONE_CONFIG_PS_PROVIDER="Other", RCLONE_CONFIG_PS_ENDPOINT=EP,
            RCLONE_CONFIG_PS_ACCESS_KEY_ID=KEY, RCLONE_CONFIG_PS_SECRET_ACCESS_KEY=SECRET,
            RCLONE_CONFIG_PS_REGION="us-east-1", RCLONE_CONFIG_PS_FORCE_PATH_STYLE="true")
# rclone's S3 SDK refuses a custom CA bundle with its own HTTP transport (and this is plain HTTP).
renv.pop("AWS_CA_BUNDLE", None)
def rclone(*args, ok=True):
    p = subprocess.run([rc, *args], capture_output=True, text=True, env=renv, timeout=300)
    if ok:
        check(p.returncode == 0, args, p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p
out = rclone("copy", "-v", src, "ps:data/rclone").stderr
check(out.count("Copied (new)") == 3, "rclone first copy", out)
for rel, b in files.items():
    check(local("rclone/" + rel) == b, "rclone copy", rel)
out = rclone("copy", "-v", src, "ps:data/rclone").stderr
check("Copied" not in out, "rclone second copy copied again", out)
out = rclone("check", src, "ps:data/rclone").stderr
check("0 differences found" in out and "could not be checked" not in out, "rclone check", out)
# One byte changed in the source, same size and time: only the hash tells, and it does.
changed = os.path.join(src, "sub/b.bin")
st = os.stat(changed)
data = bytearray(files["sub/b.bin"]); data[100] ^= 1
open(changed, "wb").write(bytes(data))
os.utime(changed, ns=(st.st_atime_ns, st.st_mtime_ns))
p = rclone("check", src, "ps:data/rclone", ok=False)
check(p.returncode != 0 and "1 differences found" in p.stderr, "rclone check missed a changed byte", p.stderr)
print("ALL OK")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boto3_s3fs_and_object_store_through_pages3() {
    let t0 = Instant::now();
    // The venv first (its first creation is slow), concurrently with the cluster start.
    let py = std::thread::spawn(python);
    let (c, data) = cluster_with_data();
    py.join().unwrap();
    let mount = format!("/data=file://{}", data.display());
    let mut gw = Gateway::writable(&c, "gw", &mount);
    let anon = Gateway::start(
        &c,
        "anon",
        // No --mount: read-only.
        &["--access-key", KEY, "--secret-key", SECRET, "--anonymous"],
    );
    eprintln!(
        "cluster and gateways up: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let env = vec![
        ("EP", gw.endpoint.clone()),
        ("EP_ANON", anon.endpoint.clone()),
        ("KEY", KEY.to_string()),
        ("SECRET", SECRET.to_string()),
        ("DATA", data.display().to_string()),
        (
            "STAGING",
            c.dir.path().join("gw-staging").display().to_string(),
        ),
        ("TREE", TREE.join(",")),
        ("BIG", BIG_DIR_FILES.to_string()),
    ];

    // s3fs first: it reads objects the boto3 script later rewrites.
    run_python("s3fs", S3FS_SCRIPT, &env, &[&gw]);

    // object_store's S3 client.
    let s3 = gw.object_store("data");
    let a = std::fs::read(data.join("objs/a.bin")).unwrap();
    let loc = StorePath::from("objs/a.bin");
    let got = s3.get(&loc).await.unwrap().bytes().await.unwrap();
    assert!(got == a, "object_store get");
    let r = s3.get_range(&loc, 1_000_000..2_100_000).await.unwrap();
    assert!(r[..] == a[1_000_000..2_100_000], "object_store range get");
    let meta = s3.head(&loc).await.unwrap();
    assert_eq!(meta.size, a.len() as u64);
    assert!(meta.e_tag.is_some());
    let mut listed: Vec<String> = s3
        .list(Some(&StorePath::from("tree")))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    listed.sort();
    assert_eq!(listed, TREE);
    let d = s3
        .list_with_delimiter(Some(&StorePath::from("tree")))
        .await
        .unwrap();
    let prefixes: Vec<String> = d.common_prefixes.iter().map(|p| p.to_string()).collect();
    let objects: Vec<String> = d.objects.iter().map(|o| o.location.to_string()).collect();
    assert_eq!(prefixes, ["tree/a", "tree/b"]);
    assert_eq!(objects, ["tree/a-b.txt", "tree/a0.txt", "tree/top.txt"]);
    let big: Vec<String> = s3
        .list(Some(&StorePath::from("big")))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    assert_eq!(
        big.len(),
        BIG_DIR_FILES,
        "object_store lists every key once"
    );
    let expected: Vec<String> = (0..BIG_DIR_FILES).map(|i| format!("big/f{i:05}")).collect();
    assert!(big == expected, "object_store listing order");
    assert!(s3.get(&StorePath::from("objs/nope")).await.is_err());
    eprintln!("object_store: done at {:.1} s", t0.elapsed().as_secs_f64());

    run_python("boto3", BOTO3_SCRIPT, &env, &[&gw, &anon]);
    run_python("s3-rules", S3_RULES_SCRIPT, &env, &[&gw]);
    let mut env = env;
    env.push(("BIN", python().parent().unwrap().display().to_string()));
    run_python("clients", CLIENTS_SCRIPT, &env, &[&gw]);

    // A clean stop; staged uploads are gone.
    let st = gw.terminate();
    assert!(st.success(), "pages3 exit status after SIGTERM: {st:?}");
    let staging = c.dir.path().join("gw-staging");
    let left: Vec<_> = std::fs::read_dir(&staging).unwrap().flatten().collect();
    assert!(
        left.is_empty(),
        "staging directory not empty: {:?}",
        left.iter().map(|e| e.path()).collect::<Vec<_>>()
    );
    eprintln!("total: {:.1} s", t0.elapsed().as_secs_f64());
}

#[test]
fn refuses_to_start_without_credentials() {
    let out = Command::new(PAGES3)
        .args(["--listen", "127.0.0.1:0", "--cluster", "127.0.0.1:9"])
        .env_remove("PAGES3_ACCESS_KEY")
        .env_remove("PAGES3_SECRET_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to start without credentials") && err.contains("--anonymous"),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
    // Half a key pair is refused too.
    let out = Command::new(PAGES3)
        .args(["--access-key", "k", "--cluster", "127.0.0.1:9"])
        .env_remove("PAGES3_SECRET_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--secret-key"));
}

/// Signing helpers for raw requests: SigV4 (headers, and aws-chunked bodies with chunk
/// signatures) and SigV2, written out so that a test controls every byte.
const RAW_HELPERS: &str = r#"
import os, hmac, hashlib, base64, datetime, socket, time, urllib.parse, zlib

def check(cond, *msg):
    if not cond:
        raise AssertionError(" ".join(map(str, msg)))

def amz_now(delta=0):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=delta)
    return t.strftime("%Y%m%dT%H%M%SZ")

def http_date(delta=0):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=delta)
    return t.strftime("%a, %d %b %Y %H:%M:%S GMT")

def signing_key(secret, day):
    k = ("AWS4" + secret).encode()
    for part in (day, "us-east-1", "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k

def sign_v4(ep, key, secret, method, path, headers, payload_hash):
    t = amz_now()
    day = t[:8]
    h = {k.lower(): str(v) for k, v in headers.items()}
    h["host"] = urllib.parse.urlsplit(ep).netloc
    h["x-amz-date"] = t
    h["x-amz-content-sha256"] = payload_hash
    names = sorted(h)
    canon = "".join("%s:%s\n" % (k, h[k].strip()) for k in names)
    signed = ";".join(names)
    creq = "\n".join([method, path, "", canon, signed, payload_hash])
    scope = "%s/us-east-1/s3/aws4_request" % day
    sts = "\n".join(["AWS4-HMAC-SHA256", t, scope, hashlib.sha256(creq.encode()).hexdigest()])
    k = signing_key(secret, day)
    sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s" % (
        key, scope, signed, sig)
    return h, sig, k, t, scope

def chunked_body(chunks, seed, k, t, scope, final=True):
    out, prev = b"", seed
    empty = hashlib.sha256(b"").hexdigest()
    for c in chunks + ([b""] if final else []):
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", t, scope, prev, empty, hashlib.sha256(c).hexdigest()])
        prev = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
        out += b"%x;chunk-signature=%s\r\n" % (len(c), prev.encode()) + c + b"\r\n"
    return out

def send(ep, method, path, headers, body=b"", partial=None, wait=30):
    """Sends a request as written; returns (status, response bytes). With `partial`, sends only
    that many body bytes and then waits for the server."""
    u = urllib.parse.urlsplit(ep)
    s = socket.create_connection((u.hostname, u.port), timeout=wait)
    head = "%s %s HTTP/1.1\r\n" % (method, path)
    for k, v in headers.items():
        head += "%s: %s\r\n" % (k, v)
    head += "connection: close\r\n\r\n"
    data = head.encode() + (body if partial is None else body[:partial])
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except ConnectionResetError:
        pass
    s.close()
    status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0
    return status, got

def put_v4(ep, key, secret, path, body, extra=None):
    h, _, _, _, _ = sign_v4(ep, key, secret, "PUT", path, dict(extra or {}, **{"content-length": len(body)}),
                            hashlib.sha256(body).hexdigest())
    return send(ep, "PUT", path, h, body)

def put_chunked(ep, key, secret, path, chunks, declared=None, final=True):
    n = sum(map(len, chunks)) if declared is None else declared
    hdr = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": n}
    # The body length is only known after signing; chunk signatures do not cover it.
    probe = chunked_body(chunks, "0" * 64, b"k", "t", "s", final)
    hdr["content-length"] = len(probe)
    h, seed, k, t, scope = sign_v4(ep, key, secret, "PUT", path, hdr, "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
    body = chunked_body(chunks, seed, k, t, scope, final)
    check(len(body) == len(probe))
    return send(ep, "PUT", path, h, body)

def sign_v2(secret, method, resource, date, md5="", ctype=""):
    sts = "%s\n%s\n%s\n%s\n%s" % (method, md5, ctype, date, resource)
    return base64.b64encode(hmac.new(secret.encode(), sts.encode(), hashlib.sha1).digest()).decode()

def put_v2(ep, key, secret, path, body, date):
    h = {"date": date, "content-length": len(body),
         "authorization": "AWS %s:%s" % (key, sign_v2(secret, "PUT", path, date))}
    return send(ep, "PUT", path, h, body)
"#;

const TRUST_SCRIPT: &str = r#"
import boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError

EP, EP_V2, KEY, SECRET, DATA = (os.environ[k] for k in ("EP", "EP_V2", "KEY", "SECRET", "DATA"))
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
             region_name="us-east-1")
s3 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET, config=cfg)

def local(key):
    return open(os.path.join(DATA, key), "rb").read()

def exists(key):
    return os.path.exists(os.path.join(DATA, key))

def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    raise AssertionError("expected an error")

def err_full(fn):
    try:
        fn()
    except ClientError as e:
        return e.response
    raise AssertionError("expected an error")

def b64(d):
    return base64.b64encode(d).decode()

small = local("objs/small.txt")

# --- 1. SigV2: refused by default, even freshly dated; with --allow-sigv2 held to the clock.
st, body = put_v2(EP, KEY, SECRET, "/data/objs/small.txt", b"v2 overwrite", http_date())
check(st == 400 and b"<Code>InvalidRequest</Code>" in body and b"Signature Version 4" in body, "sigv2 default", st, body)
check(local("objs/small.txt") == small, "sigv2 refused: nothing written")
v2 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                  config=cfg.merge(Config(signature_version="s3")))
check(err(lambda: v2.get_object(Bucket="data", Key="objs/small.txt")) == (400, "InvalidRequest"), "boto3 sigv2")
# Requests to a bucket itself too (boto3 signs its resource as "/data/" and sends "/data").
check(err(lambda: v2.list_objects(Bucket="data")) == (400, "InvalidRequest"), "boto3 sigv2 bucket")
url = v2.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "objs/small.txt"}, ExpiresIn=60)
u = urllib.parse.urlsplit(url)
st, body = send(EP, "GET", u.path + "?" + u.query, {"host": u.netloc})
check(st == 400 and b"InvalidRequest" in body, "sigv2 presigned", st, body)
# --allow-sigv2: a fresh date works (so the signer is right) ...
st, body = put_v2(EP_V2, KEY, SECRET, "/data/v2/obj", b"first", http_date())
check(st == 200 and local("v2/obj") == b"first", "sigv2 allowed", st, body)
# ... a captured request replayed 20 minutes later, with another body, does not.
st, body = put_v2(EP_V2, KEY, SECRET, "/data/v2/obj", b"replayed", http_date(-20 * 60))
check(st == 403 and b"RequestTimeTooSkewed" in body, "sigv2 replay", st, body)
check(local("v2/obj") == b"first", "replay kept the object")
v2b = boto3.client("s3", endpoint_url=EP_V2, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                   config=cfg.merge(Config(signature_version="s3")))
keys = [o["Key"] for o in v2b.list_objects(Bucket="data", Prefix="v2/")["Contents"]]
check(keys == ["v2/obj"], "sigv2 bucket listing", keys)
check(v2b.head_bucket(Bucket="data")["ResponseMetadata"]["HTTPStatusCode"] == 200, "sigv2 head bucket")
url = v2b.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "v2/obj"}, ExpiresIn=8 * 86400)
u = urllib.parse.urlsplit(url)
st, body = send(EP_V2, "GET", u.path + "?" + u.query, {"host": u.netloc})
check(st == 400 and b"AuthorizationQueryParametersError" in body, "sigv2 presigned 8 days", st, body)

# --- 3. Presigned SigV4 URLs live at most 7 days.
v4 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                  config=cfg.merge(Config(signature_version="s3v4")))
for secs, want in [(3600, 200), (604800, 200), (604801, 400)]:
    url = v4.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "objs/small.txt"}, ExpiresIn=secs)
    u = urllib.parse.urlsplit(url)
    st, body = send(EP, "GET", u.path + "?" + u.query, {"host": u.netloc})
    check(st == want, "presigned", secs, st, body[:300])
    if want == 400:
        check(b"AuthorizationQueryParametersError" in body, body)

# --- 2. Digests: a wrong one is BadDigest, a malformed Content-MD5 InvalidDigest, a malformed
# checksum BadDigest (it cannot match); nothing is stored.
new = b"new bytes for small.txt"
md5 = lambda d: b64(hashlib.md5(d).digest())
sha = lambda d: b64(hashlib.sha256(d).digest())
crc = lambda d: b64((zlib.crc32(d) & 0xffffffff).to_bytes(4, "big"))
check(err(lambda: s3.put_object(Bucket="data", Key="objs/small.txt", Body=new, ContentMD5=md5(b"other"))) == (400, "BadDigest"))
check(err(lambda: s3.put_object(Bucket="data", Key="objs/small.txt", Body=new, ContentMD5="not base64!")) == (400, "InvalidDigest"))
for hdr, good, bad in [("x-amz-checksum-sha256", sha(new), sha(b"other")),
                       ("x-amz-checksum-crc32", crc(new), crc(b"other")),
                       ("content-md5", md5(new), md5(b"other"))]:
    st, body = put_v4(EP, KEY, SECRET, "/data/objs/small.txt", new, {hdr: bad})
    check(st == 400 and b"BadDigest" in body, hdr, st, body)
    st, body = put_v4(EP, KEY, SECRET, "/data/objs/small.txt", new, {hdr: "AAAA"})
    malformed = b"InvalidDigest" if hdr == "content-md5" else b"BadDigest"
    check(st == 400 and malformed in body, hdr, "malformed", st, body)
    check(local("objs/small.txt") == small, "old object intact after", hdr)
st, body = put_v4(EP, KEY, SECRET, "/data/digest/ok", new, {"content-md5": md5(new), "x-amz-checksum-sha256": sha(new), "x-amz-checksum-crc32": crc(new)})
check(st == 200 and local("digest/ok") == new, "right digests", st, body)
r = s3.put_object(Bucket="data", Key="digest/boto", Body=new, ContentMD5=md5(new), ChecksumSHA256=sha(new))
check(local("digest/boto") == new)
# The checksum a PutObject named is kept with the version it wrote: answered by the write, by
# HeadObject and whole-object GetObject when asked (x-amz-checksum-mode), by
# GetObjectAttributes; not by a ranged read, nor once the object is replaced.
sums = lambda d: {k: v for k, v in d.items() if k.startswith("Checksum") and k != "ChecksumType"}
check(sums(r) == {"ChecksumSHA256": sha(new)}, "put answers its checksum", r)
check(sums(s3.head_object(Bucket="data", Key="digest/boto")) == {}, "head without checksum mode")
h = s3.head_object(Bucket="data", Key="digest/boto", ChecksumMode="ENABLED")
check(sums(h) == {"ChecksumSHA256": sha(new)}, "head", h)
g = s3.get_object(Bucket="data", Key="digest/boto", ChecksumMode="ENABLED")
check(g["Body"].read() == new and sums(g) == {"ChecksumSHA256": sha(new)}, "get", g)
g = s3.get_object(Bucket="data", Key="digest/boto", ChecksumMode="ENABLED", Range="bytes=0-3")
check(g["Body"].read() == new[:4] and sums(g) == {}, "ranged get", g)
a = s3.get_object_attributes(Bucket="data", Key="digest/boto", ObjectAttributes=["Checksum", "ObjectSize"])
check(sums(a["Checksum"]) == {"ChecksumSHA256": sha(new)} and a["ObjectSize"] == len(new), "attributes", a)
s3.put_object(Bucket="data", Key="digest/boto", Body=b"replaced", ChecksumAlgorithm="CRC32")
h = s3.head_object(Bucket="data", Key="digest/boto", ChecksumMode="ENABLED")
check(sums(h) == {"ChecksumCRC32": crc(b"replaced")}, "head after a replace", h)
big = os.urandom(20 * 1024 * 1024 + 5)
check(err(lambda: s3.put_object(Bucket="data", Key="digest/big", Body=big, ChecksumSHA256=sha(b"x"))) == (400, "BadDigest"))
check(not exists("digest/big"), "large object with a wrong digest not stored")
uid = s3.create_multipart_upload(Bucket="data", Key="digest/mp")["UploadId"]
check(err(lambda: s3.upload_part(Bucket="data", Key="digest/mp", UploadId=uid, PartNumber=1, Body=new, ContentMD5=md5(b"x"))) == (400, "BadDigest"))
e1 = s3.upload_part(Bucket="data", Key="digest/mp", UploadId=uid, PartNumber=1, Body=new, ContentMD5=md5(new))["ETag"]
s3.complete_multipart_upload(Bucket="data", Key="digest/mp", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})
check(local("digest/mp") == new)
a = s3.get_object_attributes(Bucket="data", Key="digest/mp", ObjectAttributes=["Checksum", "ObjectSize"])
check("Checksum" not in a and a["ObjectSize"] == len(new), "multipart: no checksum kept", a)

# --- 4. aws-chunked bodies: complete ones pass, cut or mislabelled ones are refused.
st, body = put_chunked(EP, KEY, SECRET, "/data/chunked/ok", [b"hello ", b"world"])
check(st == 200 and local("chunked/ok") == b"hello world", "chunked ok", st, body)
st, body = put_chunked(EP, KEY, SECRET, "/data/chunked/ok", [b"cut short"], final=False)
check(st == 400 and b"IncompleteBody" in body, "no final chunk", st, body)
for declared in (5, 50):
    st, body = put_chunked(EP, KEY, SECRET, "/data/chunked/ok", [b"0123456789"], declared=declared)
    check(st == 400 and b"IncompleteBody" in body, "declared", declared, st, body)
check(local("chunked/ok") == b"hello world", "chunked: old object intact")

# --- 5. Error answers carry no server paths or store locations.
resp = err_full(lambda: s3.put_object(Bucket="data", Key="objs/small.txt/child", Body=b"x"))
msg = str(resp["Error"])
check(DATA not in msg and "file://" not in msg and "/tmp" not in msg, "error leaks", msg)
st, body = put_v4(EP, KEY, SECRET, "/data/objs/small.txt/child", b"x")
check(st >= 400 and DATA.encode() not in body and b"file://" not in body, st, body)

# --- 6. Long keys: 400 KeyTooLongError, not a retriable 503.
for k in ["a" * 256, "objs/" + "b" * 300 + "/c", "d/" * 512 + "e"]:
    check(err(lambda: s3.get_object(Bucket="data", Key=k)) == (400, "KeyTooLongError"), "get", len(k))
    check(err(lambda: s3.put_object(Bucket="data", Key=k, Body=b"x")) == (400, "KeyTooLongError"), "put", len(k))
check(s3.put_object(Bucket="data", Key="long/" + "f" * 250, Body=b"ok")["ResponseMetadata"]["HTTPStatusCode"] == 200)
check(s3.get_object(Bucket="data", Key="long/" + "f" * 250)["Body"].read() == b"ok")
# A written segment may be as long as a file name (the store stages under a short name).
check(s3.put_object(Bucket="data", Key="long/" + "g" * 255, Body=b"x")["ResponseMetadata"]["HTTPStatusCode"] == 200)
check(s3.get_object(Bucket="data", Key="long/" + "g" * 255)["Body"].read() == b"x")
check(s3.list_objects_v2(Bucket="data", Prefix="x" * 300 + "/")["KeyCount"] == 0)

# --- 7. Ranges S3 ignores get the whole object; no range of an empty object is satisfiable.
whole = local("objs/a.bin")
for rng in ["bytes=5-3", "bytes=0-1,4-5", "bytes=abc", "items=0-5"]:
    r = s3.get_object(Bucket="data", Key="objs/a.bin", Range=rng)
    check(r["ResponseMetadata"]["HTTPStatusCode"] == 200 and "ContentRange" not in r, rng, r["ResponseMetadata"])
    check(r["Body"].read() == whole, "whole object for", rng)
    h = s3.head_object(Bucket="data", Key="objs/a.bin", Range=rng)
    check(h["ContentLength"] == len(whole), "head", rng)
r = s3.get_object(Bucket="data", Key="objs/a.bin", Range="bytes=0-3")
check(r["ResponseMetadata"]["HTTPStatusCode"] == 206 and r["Body"].read() == whole[:4])
for rng in ["bytes=-3", "bytes=0-", "bytes=0-0"]:
    check(err(lambda: s3.get_object(Bucket="data", Key="objs/empty", Range=rng)) == (416, "InvalidRange"), "empty", rng)

# --- 10. DeleteObjects: at most 1,000 keys; over that nothing is deleted.
s3.put_object(Bucket="data", Key="del/a", Body=b"a")
s3.put_object(Bucket="data", Key="del/b", Body=b"b")
keys = [{"Key": "del/a"}, {"Key": "del/b"}] + [{"Key": "del/n%04d" % i} for i in range(999)]
check(err(lambda: s3.delete_objects(Bucket="data", Delete={"Objects": keys})) == (400, "MalformedXML"))
check(exists("del/a") and exists("del/b"), "nothing deleted")
r = s3.delete_objects(Bucket="data", Delete={"Objects": keys[:1000]})
check(not exists("del/a") and not exists("del/b") and len(r["Deleted"]) == 1000)

# --- 11. A body that stops half-way is refused after the stall deadline (2 s here).
path = "/data/stall/obj"
body = b"x" * 100
h, _, _, _, _ = sign_v4(EP, KEY, SECRET, "PUT", path, {"content-length": 100}, "UNSIGNED-PAYLOAD")
t0 = time.time()
st, got = send(EP, "PUT", path, h, body, partial=10, wait=20)
took = time.time() - t0
check(took < 8, "stalled body held for", took)
check(st in (0, 400), st, got)
check(not exists("stall/obj"), "stalled body not stored")
print("ALL OK")
"#;

/// Staged upload files (`name#digits`) under `dir`.
fn staged_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if pages3::is_staged_name(&e.file_name().to_string_lossy()) {
                out.push(p);
            }
        }
    }
    out
}

/// Waits up to `limit` for `cond`.
fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

const FULL_SCRIPT: &str = r#"
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
EP, KEY, SECRET, DATA = (os.environ[k] for k in ("EP", "KEY", "SECRET", "DATA"))
cfg = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1, "mode": "standard"},
             region_name="us-east-1")
s3 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET, config=cfg)
def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code"), e.response["Error"].get("Message")
    raise AssertionError("expected an error")
big = os.urandom(48 * 1024 * 1024)
st, code, msg = err(lambda: s3.put_object(Bucket="data", Key="full/obj", Body=big))
check((st, code) == (400, "EntityTooLarge") and "free space" in msg and DATA not in msg, st, code, msg)
check(open(os.path.join(DATA, "full/obj"), "rb").read() == b"old", "old object intact")
uid = s3.create_multipart_upload(Bucket="data", Key="full/mp")["UploadId"]
st, code, msg = err(lambda: s3.upload_part(Bucket="data", Key="full/mp", UploadId=uid, PartNumber=1, Body=big[:12 * 1024 * 1024]))
check((st, code) == (400, "EntityTooLarge") and "staging directory" in msg, st, code, msg)
s3.abort_multipart_upload(Bucket="data", Key="full/mp", UploadId=uid)
print("ALL OK")
"#;

const KILL_SCRIPT: &str = r#"
EP, KEY, SECRET = (os.environ[k] for k in ("EP", "KEY", "SECRET"))
n = 40 * 1024 * 1024
h, _, _, _, _ = sign_v4(EP, KEY, SECRET, "PUT", "/data/victim/big.bin", {"content-length": n}, "UNSIGNED-PAYLOAD")
# Half the body, then hold the connection until killed.
send(EP, "PUT", "/data/victim/big.bin", h, b"x" * n, partial=20 * 1024 * 1024, wait=120)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages3_refuses_what_s3_refuses() {
    let py = std::thread::spawn(python);
    let (c, data) = cluster_with_data();
    py.join().unwrap();
    let mount = format!("/data=file://{}", data.display());
    let creds = [
        "--access-key",
        KEY,
        "--secret-key",
        SECRET,
        "--mount",
        &mount,
    ];
    let with = |more: &[&'static str]| -> Vec<&str> {
        creds.iter().copied().chain(more.iter().copied()).collect()
    };
    let gw = Gateway::start(
        &c,
        "trust",
        &with(&[
            "--header-timeout",
            "2",
            "--body-timeout",
            "2",
            "--max-connections-per-ip",
            "16",
        ]),
    );
    let v2 = Gateway::start(&c, "trust-v2", &with(&["--allow-sigv2"]));
    let mut env = vec![
        ("EP", gw.endpoint.clone()),
        ("EP_V2", v2.endpoint.clone()),
        ("KEY", KEY.to_string()),
        ("SECRET", SECRET.to_string()),
        ("DATA", data.display().to_string()),
    ];
    run_python(
        "trust",
        &format!("{RAW_HELPERS}{TRUST_SCRIPT}"),
        &env,
        &[&gw, &v2],
    );
    drop(v2);

    // 11. Connections over the per-address limit are answered 503 and closed at once; half a
    // request head is cut off after the header deadline (2 s here).
    let addr = gw.endpoint.trim_start_matches("http://").to_string();
    let idle: Vec<std::net::TcpStream> = (0..16)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            std::io::Write::write_all(&mut s, b"GET /data HTTP/1.1\r\nhost: x\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let read_all = |mut s: std::net::TcpStream, limit: Duration| {
        s.set_read_timeout(Some(limit)).unwrap();
        let t0 = Instant::now();
        let mut got = Vec::new();
        let r = std::io::Read::read_to_end(&mut s, &mut got);
        assert!(
            r.is_ok()
                || r.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "still open after {limit:?}: {r:?}"
        );
        (String::from_utf8_lossy(&got).to_string(), t0.elapsed())
    };
    let extra = std::net::TcpStream::connect(&addr).unwrap();
    let (got, took) = read_all(extra, Duration::from_secs(5));
    assert!(
        got.starts_with("HTTP/1.1 503") && took < Duration::from_secs(1),
        "the 17th connection: {took:?} {got:?}"
    );
    for s in idle {
        let (_, took) = read_all(s, Duration::from_secs(10));
        assert!(took < Duration::from_secs(4), "half a head kept {took:?}");
    }
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    std::io::Write::write_all(
        &mut s,
        b"GET /data HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let (got, _) = read_all(s, Duration::from_secs(10));
    assert!(got.starts_with("HTTP/1.1 403"), "served again: {got:?}");
    drop(gw);

    // 9. A write that does not fit the store: an S3 error, not a broken pipe; nothing left.
    std::fs::create_dir_all(data.join("full")).unwrap();
    std::fs::write(data.join("full/obj"), b"old").unwrap();
    let full = Gateway::start_with(&c, "full", &creds, Some(8 << 20));
    env[0].1 = full.endpoint.clone();
    run_python(
        "full",
        &format!("{RAW_HELPERS}{FULL_SCRIPT}"),
        &env,
        &[&full],
    );
    assert_eq!(
        staged_files(&data),
        Vec::<PathBuf>::new(),
        "staged files left"
    );
    drop(full);

    // 8. A gateway killed mid-upload leaves `<key>#1`; the next start removes it.
    let mut victim = Gateway::start(&c, "victim", &creds);
    env[0].1 = victim.endpoint.clone();
    let script = tempfile::Builder::new().suffix(".py").tempfile().unwrap();
    std::fs::write(script.path(), format!("{RAW_HELPERS}{KILL_SCRIPT}")).unwrap();
    let mut writer = Command::new(python())
        .arg(script.path())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The local store stages the upload under a temporary name in the key's directory.
    let victim_dir = data.join("victim");
    let appeared = wait_for(Duration::from_secs(60), || {
        !staged_files(&victim_dir).is_empty()
    });
    victim.child.kill().unwrap();
    victim.child.wait().unwrap();
    let _ = writer.kill();
    let _ = writer.wait();
    assert!(
        appeared,
        "the upload never staged a file in {}: {}",
        victim_dir.display(),
        victim.log()
    );
    let staged = staged_files(&victim_dir);
    assert!(
        !staged.is_empty(),
        "the killed gateway's staged file is the case under test"
    );
    drop(victim);
    let again = Gateway::start(&c, "victim", &creds);
    assert!(
        wait_for(Duration::from_secs(20), || staged
            .iter()
            .all(|p| !p.exists())),
        "{staged:?} still there after a restart: {}",
        again.log()
    );
    assert_eq!(staged_files(&data), Vec::<PathBuf>::new());
}

/// Buckets over a mount of the namespace's root: boto3 makes, lists, fills, empties and removes
/// them (what S3 conformance suites and `aws s3 mb` do); versions of unversioned buckets; ACLs
/// and expected owners.
const BUCKETS_SCRIPT: &str = r#"
import os
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
EP, KEY, SECRET, ROOT = (os.environ[k] for k in ("EP", "KEY", "SECRET", "ROOT"))
s3 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                region_name="us-east-1"))

def check(cond, *msg):
    if not cond:
        raise AssertionError(" ".join(map(str, msg)))

def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    raise AssertionError("expected an error")

names = lambda: [b["Name"] for b in s3.list_buckets()["Buckets"]]
check(names() == ["old"], names())
# A new bucket: listed and there at once, empty, before it holds anything.
s3.create_bucket(Bucket="fresh-bucket")
check(names() == ["fresh-bucket", "old"], names())
s3.head_bucket(Bucket="fresh-bucket")
check(s3.list_objects_v2(Bucket="fresh-bucket")["KeyCount"] == 0)
check(s3.create_bucket(Bucket="fresh-bucket")["ResponseMetadata"]["HTTPStatusCode"] == 200)
check(err(lambda: s3.create_bucket(Bucket="Bad_Name")) == (400, "InvalidBucketName"))
s3.put_object(Bucket="fresh-bucket", Key="a/b.txt", Body=b"bee")
s3.put_object(Bucket="fresh-bucket", Key="c.txt", Body=b"sea")
check(open(os.path.join(ROOT, "fresh-bucket/a/b.txt"), "rb").read() == b"bee")
check(err(lambda: s3.delete_bucket(Bucket="fresh-bucket")) == (409, "BucketNotEmpty"))
# ACLs: the owner has full control of everything, and only that ACL can be set; any other is
# refused (never taken and ignored), and the write that asked for it does not happen.
full = lambda acl: (acl["Owner"]["ID"], [(g["Grantee"]["ID"], g["Grantee"]["Type"], g["Permission"])
                                        for g in acl["Grants"]])
OWNER = ("pagestore", [("pagestore", "CanonicalUser", "FULL_CONTROL")])
check(full(s3.get_bucket_acl(Bucket="fresh-bucket")) == OWNER)
check(full(s3.get_object_acl(Bucket="fresh-bucket", Key="a/b.txt")) == OWNER)
s3.put_bucket_acl(Bucket="fresh-bucket", ACL="private")
s3.put_object(Bucket="fresh-bucket", Key="c.txt", Body=b"sea", ACL="bucket-owner-full-control")
s3.put_object_acl(Bucket="fresh-bucket", Key="c.txt", AccessControlPolicy={
    "Owner": {"ID": "pagestore"},
    "Grants": [{"Grantee": {"ID": "pagestore", "Type": "CanonicalUser"}, "Permission": "FULL_CONTROL"}]})
NO_ACL = (400, "AccessControlListNotSupported")
ALL_USERS = 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'
check(err(lambda: s3.put_bucket_acl(Bucket="fresh-bucket", ACL="public-read")) == NO_ACL)
check(err(lambda: s3.put_object_acl(Bucket="fresh-bucket", Key="c.txt", GrantRead=ALL_USERS)) == NO_ACL)
check(err(lambda: s3.put_object(Bucket="fresh-bucket", Key="p.txt", Body=b"p", ACL="public-read")) == NO_ACL)
check(err(lambda: s3.copy_object(Bucket="fresh-bucket", Key="p.txt", ACL="public-read-write",
                                 CopySource={"Bucket": "fresh-bucket", "Key": "c.txt"})) == NO_ACL)
check(err(lambda: s3.create_multipart_upload(Bucket="fresh-bucket", Key="p.txt", ACL="authenticated-read")) == NO_ACL)
check(err(lambda: s3.create_bucket(Bucket="public-bucket", ACL="public-read")) == NO_ACL)
check(err(lambda: s3.head_object(Bucket="fresh-bucket", Key="p.txt"))[0] == 404)
check("public-bucket" not in names(), names())
check(err(lambda: s3.get_object_acl(Bucket="fresh-bucket", Key="nothing")) == (404, "NoSuchKey"))
check(err(lambda: s3.get_bucket_acl(Bucket="no-such-bucket")) == (404, "NoSuchBucket"))
# A request meant for another owner's bucket is refused.
check(err(lambda: s3.list_objects_v2(Bucket="fresh-bucket", ExpectedBucketOwner="123456789012")) == (403, "AccessDenied"))
check(err(lambda: s3.put_object(Bucket="fresh-bucket", Key="p.txt", Body=b"p", ExpectedBucketOwner="x")) == (403, "AccessDenied"))
check(s3.list_objects_v2(Bucket="fresh-bucket", ExpectedBucketOwner="pagestore")["KeyCount"] == 2)
# Versions of an unversioned bucket: one each, "null", the latest.
check(s3.get_bucket_versioning(Bucket="fresh-bucket").get("Status") is None)
v = s3.list_object_versions(Bucket="fresh-bucket")
check([(x["Key"], x["VersionId"], x["IsLatest"]) for x in v["Versions"]]
      == [("a/b.txt", "null", True), ("c.txt", "null", True)], v)
v = s3.list_object_versions(Bucket="fresh-bucket", MaxKeys=1)
check(v["IsTruncated"] and v["NextKeyMarker"] == "a/b.txt" and v["NextVersionIdMarker"] == "null", v)
v = s3.list_object_versions(Bucket="fresh-bucket", KeyMarker="a/b.txt", VersionIdMarker="null")
check([x["Key"] for x in v["Versions"]] == ["c.txt"], v)
check(s3.get_object(Bucket="fresh-bucket", Key="c.txt", VersionId="null")["Body"].read() == b"sea")
check(err(lambda: s3.get_object(Bucket="fresh-bucket", Key="c.txt", VersionId="3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"))
      == (400, "InvalidArgument"))
check(err(lambda: s3.head_object(Bucket="fresh-bucket", Key="c.txt", VersionId="other"))[0] == 400)
r = s3.delete_objects(Bucket="fresh-bucket", Delete={"Objects": [
    {"Key": "a/b.txt", "VersionId": "null"}, {"Key": "c.txt", "VersionId": "other"}]})
check([(d["Key"], d.get("VersionId")) for d in r.get("Deleted", [])] == [("a/b.txt", "null")], r)
check([(e["Key"], e["Code"]) for e in r.get("Errors", [])] == [("c.txt", "InvalidArgument")], r)
s3.delete_object(Bucket="fresh-bucket", Key="c.txt", VersionId="null")
check(s3.list_object_versions(Bucket="fresh-bucket").get("Versions", []) == [])
# Empty again: it goes, and stays gone.
check(s3.delete_bucket(Bucket="fresh-bucket")["ResponseMetadata"]["HTTPStatusCode"] == 204)
check(names() == ["old"], names())
check(err(lambda: s3.head_bucket(Bucket="fresh-bucket"))[0] == 404)
check(err(lambda: s3.delete_bucket(Bucket="fresh-bucket")) == (404, "NoSuchBucket"))
check(err(lambda: s3.put_object(Bucket="fresh-bucket", Key="x", Body=b"x")) == (404, "NoSuchBucket"))
# A bucket that holds objects in the store is there without CreateBucket, and cannot go.
check(err(lambda: s3.delete_bucket(Bucket="old")) == (409, "BucketNotEmpty"))
print("ALL OK")
"#;

/// `pages3 --mount /=URL` makes and removes buckets (CreateBucket, DeleteBucket), as S3 clients
/// and conformance suites expect of an S3 endpoint; buckets are never versioned, and answer
/// the version calls as an unversioned S3 bucket does.
#[test]
fn a_gateway_over_the_root_makes_and_removes_buckets() {
    let (dir, mut s) = common::settings();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("old")).unwrap();
    std::fs::write(root.join("old/kept.txt"), b"kept").unwrap();
    let mount = format!("/=file://{}", root.display());
    s.mounts = vec![mount.clone()];
    let c = Cluster::start(dir, s);
    let gw = Gateway::writable(&c, "gw", &mount);
    let env = vec![
        ("EP", gw.endpoint.clone()),
        ("KEY", KEY.to_string()),
        ("SECRET", SECRET.to_string()),
        ("ROOT", root.display().to_string()),
    ];
    run_python("buckets", BUCKETS_SCRIPT, &env, &[&gw]);
    assert!(!root.join("fresh-bucket/a/b.txt").exists());
    assert_eq!(std::fs::read(root.join("old/kept.txt")).unwrap(), b"kept");
}

/// Both halves of `multipart_uploads_outlive_a_killed_gateway` (`PHASE` 1 before the kill,
/// 2 after the restart; the upload id passes through the file `STATE`).
/// The environment of a boto3 script run in phases (`BOTO3_CLIENT`): the gateway's endpoint
/// and keys, the phase, and the file the phases share what they saw in.
fn phase_env(gw: &Gateway, phase: &str, state: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("EP", gw.endpoint.clone()),
        ("KEY", KEY.to_string()),
        ("SECRET", SECRET.to_string()),
        ("PHASE", phase.to_string()),
        ("STATE", state.display().to_string()),
    ]
}

const MP_RESTART_SCRIPT: &str = r#"
import random, hashlib, base64
DATA, PHASE, STATE = (os.environ[k] for k in ("DATA", "PHASE", "STATE"))
key = "ck/model.bin"
parts = [random.Random(n).randbytes(5 << 20 if n < 3 else 1000) for n in (1, 2, 3)]
sha = lambda d: base64.b64encode(hashlib.sha256(d).digest()).decode()
if PHASE == "1":
    uid = s3.create_multipart_upload(Bucket="data", Key=key, ContentType="text/x-ckpt",
                                     Metadata={"step": "7"}, ChecksumAlgorithm="SHA256")["UploadId"]
    for n in (1, 2):
        s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=n, Body=parts[n - 1])
    open(STATE, "w").write(uid)
else:
    uid = open(STATE).read()
    ups = s3.list_multipart_uploads(Bucket="data").get("Uploads", [])
    check([(u["Key"], u["UploadId"]) for u in ups] == [(key, uid)], "the upload is back", ups)
    listed = s3.list_parts(Bucket="data", Key=key, UploadId=uid)["Parts"]
    check([(p["PartNumber"], p["Size"], p["ETag"], p["ChecksumSHA256"]) for p in listed]
          == [(n, len(parts[n - 1]), '"%s"' % hashlib.md5(parts[n - 1]).hexdigest(), sha(parts[n - 1]))
              for n in (1, 2)], "its parts are back, and only those", listed)
    r = s3.upload_part(Bucket="data", Key=key, UploadId=uid, PartNumber=3, Body=parts[2])
    check(r["ChecksumSHA256"] == sha(parts[2]), "the upload's checksum algorithm is back", r)
    done = [{"PartNumber": p["PartNumber"], "ETag": p["ETag"]} for p in listed] + \
           [{"PartNumber": 3, "ETag": r["ETag"]}]
    r = s3.complete_multipart_upload(Bucket="data", Key=key, UploadId=uid, MultipartUpload={"Parts": done})
    want = base64.b64encode(hashlib.sha256(b"".join(hashlib.sha256(p).digest() for p in parts)).digest()).decode() + "-3"
    check(r["ChecksumSHA256"] == want, "the composite checksum", r)
    check(open(os.path.join(DATA, key), "rb").read() == b"".join(parts), "the object's bytes")
    h = s3.head_object(Bucket="data", Key=key)
    check(h["ContentType"] == "text/x-ckpt" and h["Metadata"] == {"step": "7"}, "its attributes", h)
print("ALL OK")
"#;

/// A multipart upload outlives its gateway: the parts staged before a SIGKILL are taken back by
/// the next start (ListMultipartUploads, ListParts, the upload's attributes and checksum
/// algorithm), a part is added and the completion writes the whole object. A part file whose
/// meta file the kill never let be written is not taken (and is removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_uploads_outlive_a_killed_gateway() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("ck")).unwrap();
    let mount = format!("/data=file://{}", data.display());
    s.mounts = vec![mount.clone()];
    let c = Cluster::start(dir, s);
    let state = c.dir.path().join("mp-state");
    let env = |gw: &Gateway, phase: &str| {
        let mut env = phase_env(gw, phase, &state);
        env.push(("DATA", data.display().to_string()));
        env
    };
    let gw = Gateway::writable(&c, "mp-kill", &mount);
    let script = format!("{BOTO3_CLIENT}{MP_RESTART_SCRIPT}");
    run_python("mp-before", &script, &env(&gw, "1"), &[&gw]);
    drop(gw); // SIGKILLed (see `Drop`)
    let uid = std::fs::read_to_string(&state).unwrap();
    let upload = c
        .dir
        .path()
        .join("mp-kill-staging")
        .join(format!("upload-{uid}"));
    assert!(upload.join("part-00002.meta").exists(), "{upload:?}");
    // As if the kill came between a part's rename and its meta file.
    let orphan = upload.join("part-00009");
    std::fs::write(&orphan, b"never answered").unwrap();
    let gw = Gateway::writable(&c, "mp-kill", &mount);
    assert!(
        !orphan.exists(),
        "a part without its meta file is removed at start"
    );
    run_python("mp-after", &script, &env(&gw, "2"), &[&gw]);
    assert!(!upload.exists(), "a completed upload's files are gone");
}

const RECORD_SCRIPT: &str = r#"
import random, json, time, datetime
from botocore.exceptions import ClientError
PHASE, STATE = os.environ["PHASE"], os.environ["STATE"]
def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    return None
blob = lambda seed, n: random.Random(seed).randbytes(n)
def multipart(bucket, key, sizes, **kw):
    uid = s3.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32", **kw)["UploadId"]
    done = []
    for n, size in enumerate(sizes, 1):
        r = s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=blob(n, size),
                           ChecksumAlgorithm="CRC32")
        done.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={"Parts": done})
OBJECTS = [("data", "t/small"), ("data", "t/large"), ("data", "t/mp"), ("data", "t/mpfull"),
           ("wb", "run/small"), ("wb", "run/mp")]
SUMS = ("ChecksumCRC32", "ChecksumSHA256", "ChecksumType")
def facts(bucket, key):
    h = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    p = s3.head_object(Bucket=bucket, Key=key, PartNumber=1, ChecksumMode="ENABLED")
    a = s3.get_object_attributes(Bucket=bucket, Key=key,
                                 ObjectAttributes=["ETag", "Checksum", "ObjectParts", "ObjectSize"])
    parts = a.get("ObjectParts", {})
    expires = h.get("ExpiresString") or (str(h["Expires"]) if "Expires" in h else None)
    return {"etag": h["ETag"], "sums": {k: h.get(k) for k in SUMS}, "meta": h["Metadata"], "expires": expires,
            "parts": p.get("PartsCount"), "part1": [p["ContentLength"]] + [p.get(k) for k in SUMS],
            "attr": [a["ETag"], a.get("Checksum"), parts.get("TotalPartsCount"),
                     [[x["PartNumber"], x["Size"], x.get("ChecksumCRC32")] for x in parts.get("Parts", [])]]}
if PHASE == "1":
    s3.put_object(Bucket="data", Key="t/small", Body=blob(0, 100_000), Metadata={"a": "1"}, ChecksumAlgorithm="CRC32",
                  Expires=datetime.datetime(2037, 10, 21, 7, 28, tzinfo=datetime.timezone.utc))
    s3.put_object(Bucket="data", Key="t/large", Body=blob(1, 20 << 20), ChecksumAlgorithm="SHA256")
    multipart("data", "t/mp", [5 << 20, 5 << 20, 1000])
    multipart("data", "t/mpfull", [5 << 20, 77], ChecksumType="FULL_OBJECT")
    s3.put_object(Bucket="wb", Key="run/small", Body=blob(2, 3000), ChecksumAlgorithm="CRC32")
    multipart("wb", "run/mp", [5 << 20, 5])
    got = {"%s/%s" % o: facts(*o) for o in OBJECTS}
    for k, f in got.items():
        check(f["sums"]["ChecksumType"] is not None, k, "has a checksum", f)
    check(got["data/t/mp"]["parts"] == 3 and got["data/t/mp"]["etag"].endswith('-3"'), got["data/t/mp"])
    check(got["data/t/small"]["meta"] == {"a": "1"}, "the record is not shown as metadata", got["data/t/small"])
    check("2037" in got["data/t/small"]["expires"] and got["data/t/large"]["expires"] is None, "Expires is kept")
    check(err(lambda: s3.put_object(Bucket="data", Key="t/forged", Body=b"x", Metadata={"pages3object": "1 size=1 etag=00"}))
          == (400, "InvalidArgument"), "the record's name is refused as a client's metadata")
    json.dump(got, open(STATE, "w"))
elif PHASE == "2":
    want = json.load(open(STATE))
    # Listed first (nothing read since the restart): each object with the ETag it was given.
    for bucket in ("data", "wb"):
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 2}):
            for o in page.get("Contents", []):
                k = "%s/%s" % (bucket, o["Key"])
                check(k not in want or o["ETag"] == want[k]["etag"], k, "is listed with", o["ETag"], "not", want[k]["etag"])
    v1 = s3.list_objects(Bucket="data", Prefix="t/")["Contents"]
    check([o["ETag"] for o in v1 if "data/" + o["Key"] in want]
          == [want["data/" + o["Key"]]["etag"] for o in v1 if "data/" + o["Key"] in want], "ListObjects", v1)
    for o in OBJECTS:
        k = "%s/%s" % o
        check(facts(*o) == want[k], k, "reads as before the restart:", facts(*o), "instead of", want[k])
    small = want["data/t/small"]["etag"]
    check(s3.get_object(Bucket="data", Key="t/small", IfMatch=small)["Body"].read() == blob(0, 100_000))
    r = s3.copy_object(Bucket="data", Key="t/copy", CopySource="data/t/small", CopySourceIfMatch=small)
    check(r["CopyObjectResult"]["ETag"] == small, "a copy has the same bytes", r)
    check(s3.head_object(Bucket="data", Key="t/copy")["ETag"] == small)
else:
    # Rewritten in place, outside the gateway, with other bytes of its size (same inode: the
    # file's extended attributes stay).
    with open(os.environ["SMALL"], "r+b") as w:
        w.write(blob(9, 100_000))
    old = json.load(open(STATE))["data/t/small"]
    # The cluster sees the new version once its metadata of the path expires; `facts` asks
    # three times, so wait until its first HEAD (the ETag) and its part HEAD both see it.
    for _ in range(300):
        f = facts("data", "t/small")
        if f["etag"] != old["etag"] and f["part1"][1] != old["part1"][1]:
            break
        time.sleep(0.1)
    check(f["etag"] != old["etag"] and f["sums"]["ChecksumType"] is None and f["meta"] == {}
          and f["expires"] is None,
          "a rewritten file keeps nothing of the object it replaced", f)
    check(s3.get_object(Bucket="data", Key="t/small")["Body"].read() == blob(9, 100_000))
print("ALL OK")
"#;

/// What an object was written with (S3's ETag, checksums, parts, for PutObject in one piece or
/// streamed, multipart COMPOSITE and FULL_OBJECT, through the store and through a write-back
/// mount) reads the same after the gateway restarts: it is recorded with the object. A copy
/// keeps it; a file rewritten in place outside the gateway does not (its extended attributes
/// stay, but describe other bytes); a client cannot set the record as metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_read_the_same_after_the_gateway_restarts() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    let wb = dir.path().join("wb");
    std::fs::create_dir_all(data.join("t")).unwrap();
    std::fs::create_dir_all(&wb).unwrap();
    let mount = format!("/data=file://{}", data.display());
    s.mounts = vec![
        mount.clone(),
        format!("/wb=file://{}?write=back", wb.display()),
    ];
    let c = Cluster::start(dir, s);
    let state = c.dir.path().join("record-state");
    let script = format!("{BOTO3_CLIENT}{RECORD_SCRIPT}");
    let gw = Gateway::writable(&c, "rec", &mount);
    run_python("rec-1", &script, &phase_env(&gw, "1", &state), &[&gw]);
    drop(gw); // SIGKILLed (see `Drop`)
    let gw = Gateway::writable(&c, "rec", &mount);
    run_python("rec-2", &script, &phase_env(&gw, "2", &state), &[&gw]);
    let mut rewrite = phase_env(&gw, "3", &state);
    rewrite.push(("SMALL", data.join("t/small").display().to_string()));
    run_python("rec-3", &script, &rewrite, &[&gw]);
}

/// `Last-Modified` (HeadObject, GetObject) and a listing's `LastModified` are the object's
/// modification time in the store, not the gateway's start time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_modified_is_the_objects_time_in_the_store() {
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("t")).unwrap();
    let old = data.join("t/old.bin");
    std::fs::write(&old, b"old bytes").unwrap();
    // 2020-01-02T03:04:05Z.
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_577_934_245);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(when)
        .unwrap();
    s.mounts = vec![format!("/data=file://{}", data.display())];
    let c = Cluster::start(dir, s);
    let gw = Gateway::start(&c, "gw", &["--access-key", KEY, "--secret-key", SECRET]);
    let s3 = gw.object_store("data");
    let loc = StorePath::from("t/old.bin");
    let head = s3.head(&loc).await.unwrap();
    assert_eq!(head.last_modified.timestamp(), 1_577_934_245);
    let got = s3.get(&loc).await.unwrap();
    assert_eq!(got.meta.last_modified.timestamp(), 1_577_934_245);
    let listed: Vec<_> = s3
        .list(Some(&StorePath::from("t")))
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].last_modified.timestamp(), 1_577_934_245);
}

/// A bucket over an S3 store whose listings carry no ETags (s3s-fs lists without them, and
/// answers an MD5 to HEAD and GET): pages3 lists the objects without an ETag rather than a
/// made-up one, and HEAD, GET and a conditional GET after the listing all see the store's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_listed_without_etags_keep_the_stores_etag() {
    let root = tempfile::tempdir().unwrap();
    let prefix = root.path().join("store-bucket").join("set");
    std::fs::create_dir_all(prefix.join("sub")).unwrap();
    let files = [
        ("a.bin", bytes(7, 2 * MIB + 5)),
        ("sub/b.txt", b"under a prefix\n".to_vec()),
    ];
    for (name, b) in &files {
        std::fs::write(prefix.join(name), b).unwrap();
    }
    let (store_key, store_secret) = ("AKIDUNDERSTORE", "under-store-secret");
    let store = pagestore_testkit::S3Server::start(root.path(), store_key, store_secret).unwrap();
    let (dir, mut s) = common::settings();
    s.mounts = vec![format!(
        "/data=s3://store-bucket/set?endpoint={}&region=us-east-1&access_key_id={store_key}\
         &secret_access_key={store_secret}",
        store.endpoint()
    )];
    let c = Cluster::start(dir, s);
    let gw = Gateway::start(&c, "gw", &["--access-key", KEY, "--secret-key", SECRET]);
    let s3 = gw.object_store("data");
    let mut listed: Vec<_> = s3.list(None).try_collect().await.unwrap();
    listed.sort_by(|a, b| a.location.cmp(&b.location));
    let names: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
    assert_eq!(names, ["a.bin", "sub/b.txt"]);
    for (meta, (name, b)) in listed.iter().zip(&files) {
        assert_eq!(meta.size, b.len() as u64, "{name}");
        assert_eq!(meta.e_tag, None, "{name}: listed with a made-up ETag");
        // Asked after the listing (which the cluster caches): the store's own ETag.
        let etag = format!("\"{:032x}\"", md5_of(b));
        let loc = StorePath::from(*name);
        let head = s3.head(&loc).await.unwrap();
        assert_eq!(head.e_tag.as_deref(), Some(etag.as_str()), "{name}");
        let got = s3
            .get_opts(
                &loc,
                object_store::GetOptions {
                    if_match: Some(etag.clone()),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(got.meta.e_tag.as_deref(), Some(etag.as_str()), "{name}");
        assert!(got.bytes().await.unwrap() == b.as_slice(), "{name}");
    }
}

/// Issue 17: a bucket on a `write=back` mount takes PutObject and multipart uploads through
/// the cluster (no store credentials on the gateway): read back at once with the body's MD5 as
/// ETag, flushed to the store with the exact bytes; conditional writes (create-only,
/// compare-and-swap) hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_back_bucket_takes_puts_and_multipart_uploads_through_the_cluster() {
    let (dir, mut s) = common::settings();
    let store = dir.path().join("ck-store");
    std::fs::create_dir_all(&store).unwrap();
    s.mounts = vec![format!("/ck=file://{}?write=back", store.display())];
    let c = Cluster::start(dir, s);
    // No --mount: the gateway has no store credentials; the cluster writes for it.
    let gw = Gateway::start(&c, "gw-wb", &["--access-key", KEY, "--secret-key", SECRET]);
    let s3 = gw.object_store("ck");
    let small = bytes(70, 100_000);
    // With a Content-Type and user metadata, which the cluster keeps with the file and the
    // flush writes with the object.
    let mut attributes = object_store::Attributes::new();
    attributes.insert(object_store::Attribute::ContentType, "text/x-ckpt".into());
    attributes.insert(
        object_store::Attribute::Metadata("step".into()),
        "100".into(),
    );
    let put = s3
        .put_opts(
            &StorePath::from("run/small.bin"),
            small.clone().into(),
            object_store::PutOptions {
                attributes: attributes.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let md5 = format!("{:032x}", md5_of(&small));
    assert_eq!(
        put.e_tag.as_deref().map(|t| t.trim_matches('"')),
        Some(md5.as_str())
    );
    let got = s3
        .get(&StorePath::from("run/small.bin"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(got == small, "a write-back PutObject read back at once");
    let served = |a: &object_store::Attributes| {
        let get = |k| a.get(&k).map(|v| v.as_ref().to_string());
        (
            get(object_store::Attribute::ContentType),
            get(object_store::Attribute::Metadata("step".into())),
        )
    };
    let want = (Some("text/x-ckpt".to_string()), Some("100".to_string()));
    let got = s3.get(&StorePath::from("run/small.bin")).await.unwrap();
    assert_eq!(served(&got.attributes), want, "attributes before the flush");
    let out = c.pagectl(&["stat", "/ck/run/small.bin"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("attr     content-type: text/x-ckpt")
            && text.contains("attr     x-amz-meta-step: 100"),
        "{text}"
    );
    let head = s3.head(&StorePath::from("run/small.bin")).await.unwrap();
    assert_eq!(
        head.e_tag.as_deref().map(|t| t.trim_matches('"')),
        Some(md5.as_str())
    );

    // A multipart upload of 3 parts (5 MiB, 5 MiB, 1 MiB + 7).
    let big = bytes(71, 11 * MIB + 7);
    let mut up = s3
        .put_multipart_opts(
            &StorePath::from("run/big.bin"),
            object_store::PutMultipartOptions {
                attributes: attributes.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    for part in [&big[..5 * MIB], &big[5 * MIB..10 * MIB], &big[10 * MIB..]] {
        up.put_part(part.to_vec().into()).await.unwrap();
    }
    up.complete().await.unwrap();
    let got = s3
        .get(&StorePath::from("run/big.bin"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(got == big, "a write-back multipart upload read back");
    let got = s3.get(&StorePath::from("run/big.bin")).await.unwrap();
    assert_eq!(
        served(&got.attributes),
        want,
        "attributes of the multipart upload"
    );
    // CopyObject within the bucket, whose name ("ck") S3 would refuse: s3s refuses such a
    // bucket in `x-amz-copy-source`, and the gateway's route takes the copy instead.
    s3.copy(
        &StorePath::from("run/big.bin"),
        &StorePath::from("run/big-copy.bin"),
    )
    .await
    .unwrap();
    let got = s3
        .get(&StorePath::from("run/big-copy.bin"))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(got == big, "a copy within a bucket S3 would not name");
    // A copy from a key that is not there is the usual 404, not a route's error.
    let missing = s3
        .copy(
            &StorePath::from("run/nothing.bin"),
            &StorePath::from("run/copy-of-nothing.bin"),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(missing, object_store::Error::NotFound { .. }),
        "{missing:?}"
    );

    // Conditional PutObject: create-only takes a new key once; compare-and-swap takes the
    // version there now only. The path's metadata owner checks and commits in one step.
    let cond = StorePath::from("run/cond.bin");
    let create = object_store::PutOptions {
        mode: object_store::PutMode::Create,
        ..Default::default()
    };
    let first = s3
        .put_opts(&cond, vec![1u8; 10].into(), create.clone())
        .await
        .unwrap();
    let again = s3
        .put_opts(&cond, vec![2u8; 10].into(), create.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(again, object_store::Error::AlreadyExists { .. })
            || again.to_string().contains("412"),
        "{again}"
    );
    let swap = |e_tag: Option<String>| object_store::PutOptions {
        mode: object_store::PutMode::Update(object_store::UpdateVersion {
            e_tag,
            version: None,
        }),
        ..Default::default()
    };
    s3.put_opts(&cond, vec![3u8; 10].into(), swap(first.e_tag.clone()))
        .await
        .unwrap();
    let stale = s3
        .put_opts(&cond, vec![4u8; 10].into(), swap(first.e_tag.clone()))
        .await
        .unwrap_err();
    assert!(
        matches!(stale, object_store::Error::Precondition { .. })
            || stale.to_string().contains("412"),
        "{stale}"
    );
    let got = s3.get(&cond).await.unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], &[3u8; 10][..]);

    // Conditional deletes (If-Match on DeleteObject, ETags in DeleteObjects): the metadata
    // owner deletes only the version the ETag names.
    let env = [
        ("EP", gw.endpoint.clone()),
        ("KEY", KEY.to_string()),
        ("SECRET", SECRET.to_string()),
    ];
    run_python(
        "wb-deletes",
        &format!("{BOTO3_CLIENT}{WB_DELETES_SCRIPT}"),
        &env,
        &[&gw],
    );

    // A key beneath an object, or an object where keys lie beneath, is a 409 as on a store
    // written through: the flush could never write it to a file system store.
    for key in ["run/big.bin/under", "run"] {
        let e = s3
            .put(&StorePath::from(key), vec![2u8; 10].into())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("409"), "{key}: {e}");
    }
    assert!(s3
        .head(&StorePath::from("run/big.bin/under"))
        .await
        .is_err());

    // Flushed: the store holds the exact bytes; a delete reaches it too.
    let out = c.pagectl(&["sync", "/ck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read(store.join("run/small.bin")).unwrap(), small);
    assert_eq!(std::fs::read(store.join("run/big.bin")).unwrap(), big);
    // The store's objects carry the attributes, and the gateway serves them after the flush.
    let local = pagestore_client::localfs::LocalStore::new(&store).unwrap();
    for key in ["run/small.bin", "run/big.bin"] {
        let kept = local
            .object_attributes(&StorePath::from(key))
            .await
            .unwrap();
        assert_eq!(served(&kept), want, "{key} in the store");
        let got = s3.get(&StorePath::from(key)).await.unwrap();
        assert_eq!(served(&got.attributes), want, "{key} after the flush");
    }
    s3.delete(&StorePath::from("run/small.bin")).await.unwrap();
    assert!(s3.head(&StorePath::from("run/small.bin")).await.is_err());
    let out = c.pagectl(&["sync", "/ck"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!store.join("run/small.bin").exists());
    assert_eq!(
        std::fs::read(store.join("run/cond.bin")).unwrap(),
        [3u8; 10]
    );
}

/// Conditional deletes on the write-back bucket `ck` (see the test above).
/// The start of the small boto3 scripts below: a client of the gateway at `EP` (path-style, no
/// retries) and `check`.
const BOTO3_CLIENT: &str = r#"
import os, boto3
from botocore.config import Config
EP, KEY, SECRET = (os.environ[k] for k in ("EP", "KEY", "SECRET"))
s3 = boto3.client("s3", endpoint_url=EP, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                  config=Config(s3={"addressing_style": "path"}, region_name="us-east-1",
                                retries={"max_attempts": 1, "mode": "standard"}))
def check(ok, *what):
    if not ok:
        raise SystemExit("FAILED: " + " ".join(map(str, what)))
"#;

const WB_DELETES_SCRIPT: &str = r#"
from botocore.exceptions import ClientError
def err(fn):
    try:
        fn()
    except ClientError as e:
        return e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"].get("Code")
    return None
def exists(key):
    return err(lambda: s3.head_object(Bucket="ck", Key=key)) is None
s3.put_object(Bucket="ck", Key="del/a", Body=b"a")
e = s3.head_object(Bucket="ck", Key="del/a")["ETag"]
check(err(lambda: s3.delete_object(Bucket="ck", Key="del/a", IfMatch='"nope"')) == (412, "PreconditionFailed"))
check(exists("del/a"), "kept after a failed If-Match")
check(err(lambda: s3.delete_object(Bucket="ck", Key="del/none", IfMatch=e)) == (404, "NoSuchKey"))
s3.delete_object(Bucket="ck", Key="del/a", IfMatch=e)
check(not exists("del/a"), "deleted with its ETag")
s3.put_object(Bucket="ck", Key="del/d1", Body=b"1")
s3.put_object(Bucket="ck", Key="del/d2", Body=b"2")
r = s3.delete_objects(Bucket="ck", Delete={"Objects": [
    {"Key": "del/d1", "ETag": '"nope"'},
    {"Key": "del/d2", "ETag": s3.head_object(Bucket="ck", Key="del/d2")["ETag"]}]})
check([x["Key"] for x in r.get("Deleted", [])] == ["del/d2"], r)
check([(x["Key"], x["Code"]) for x in r.get("Errors", [])] == [("del/d1", "PreconditionFailed")], r)
check(exists("del/d1") and not exists("del/d2"))
# A multipart upload with a whole-object CRC32 through the cluster: a wrong one commits
# nothing; the right one is answered and kept.
import base64, zlib
crc = lambda d: base64.b64encode((zlib.crc32(d) & 0xffffffff).to_bytes(4, "big")).decode()
r = s3.create_multipart_upload(Bucket="ck", Key="sum/full", ChecksumAlgorithm="CRC32",
                               ChecksumType="FULL_OBJECT")
uid = r["UploadId"]
ps = [os.urandom(5 << 20), os.urandom(1000)]
parts = [{"PartNumber": i + 1, "ETag": s3.upload_part(Bucket="ck", Key="sum/full", UploadId=uid,
          PartNumber=i + 1, Body=p)["ETag"]} for i, p in enumerate(ps)]
check(err(lambda: s3.complete_multipart_upload(Bucket="ck", Key="sum/full", UploadId=uid,
      MultipartUpload={"Parts": parts}, ChecksumCRC32=crc(b"x"))) == (400, "BadDigest"))
check(not exists("sum/full"), "nothing committed with a wrong checksum")
r = s3.complete_multipart_upload(Bucket="ck", Key="sum/full", UploadId=uid,
                                 MultipartUpload={"Parts": parts}, ChecksumCRC32=crc(b"".join(ps)))
check(r["ChecksumCRC32"] == crc(b"".join(ps)), r)
g = s3.get_object(Bucket="ck", Key="sum/full", PartNumber=2, ChecksumMode="ENABLED")
check(g["Body"].read() == ps[1] and g["PartsCount"] == 2 and g["ChecksumCRC32"] == crc(ps[1]), g)
check(s3.get_object(Bucket="ck", Key="sum/full")["Body"].read() == b"".join(ps))
print("ALL OK")
"#;

fn md5_of(b: &[u8]) -> u128 {
    use s3s::crypto::{Checksum as _, Md5};
    let mut h = Md5::new();
    h.update(b);
    u128::from_be_bytes(h.finalize().as_ref().try_into().unwrap())
}

/// An s3fs-fuse mount of a bucket; unmounted and stopped when dropped.
struct S3fsMount {
    child: Child,
    dir: PathBuf,
}

impl Drop for S3fsMount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.dir)
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mounted(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(dir.to_str().unwrap()))
}

/// s3fs-fuse (a FUSE file system over any S3 endpoint) on a pages3 bucket: reads, and the
/// writes coreutils make (mkdir, cp -r, mv, rm, rmdir), each checked against the store.
#[test]
fn s3fs_fuse_mounts_a_bucket_and_works_like_a_disk() {
    let s3fs = Command::new("s3fs").arg("--version").output();
    assert!(
        s3fs.is_ok_and(|o| o.status.success()),
        "s3fs-fuse is not installed (apt-get install s3fs)"
    );
    let (dir, mut s) = common::settings();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("sub/a.bin"), bytes(7, 3 * MIB + 5)).unwrap();
    std::fs::write(data.join("top.txt"), b"top\n").unwrap();
    let mount = format!("/data=file://{}", data.display());
    s.mounts = vec![mount.clone()];
    let c = Cluster::start(dir, s);
    let gw = Gateway::writable(&c, "gw", &mount);
    let work = c.dir.path().join("s3fs-work");
    let mnt = c.dir.path().join("s3fs-mnt");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&mnt).unwrap();
    let pw = work.join("passwd");
    std::fs::write(&pw, format!("{KEY}:{SECRET}\n")).unwrap();
    std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let log = work.join("s3fs.log");
    let child = Command::new("s3fs")
        .arg("data")
        .arg(&mnt)
        .arg("-f")
        .args(["-o", &format!("passwd_file={}", pw.display())])
        .args(["-o", &format!("url={}", gw.endpoint)])
        .args(["-o", "use_path_request_style", "-o", "dbglevel=warn"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let fuse = S3fsMount {
        child,
        dir: mnt.clone(),
    };
    assert!(
        wait_for(Duration::from_secs(15), || mounted(&mnt)),
        "s3fs did not mount; its log:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let script = r#"
set -eux
cmp "$M/sub/a.bin" "$D/sub/a.bin"
test "$(cat "$M/top.txt")" = top
ls "$M" | grep -qx sub
# mkdir: the marker it puts makes the directory there at once, empty.
mkdir "$M/newdir"
test -d "$M/newdir"
ls "$M" | grep -qx newdir
head -c 5000123 /dev/urandom > "$W/src.bin"
cp "$W/src.bin" "$M/newdir/f.bin"
cmp "$M/newdir/f.bin" "$W/src.bin"
cmp "$D/newdir/f.bin" "$W/src.bin"
# A tree, copied in with its directories.
mkdir -p "$W/tree/x/y" "$W/tree/empty"
echo one > "$W/tree/one.txt"; echo two > "$W/tree/x/two.txt"
head -c 70000 /dev/urandom > "$W/tree/x/y/three.bin"
cp -r "$W/tree" "$M/tree"
diff -r "$W/tree" "$M/tree"
cmp "$D/tree/x/y/three.bin" "$W/tree/x/y/three.bin"
# Rename (a copy and a delete in S3), remove, remove the directories.
mv "$M/newdir/f.bin" "$M/newdir/g.bin"
cmp "$D/newdir/g.bin" "$W/src.bin"
test ! -e "$D/newdir/f.bin"
rm "$M/newdir/g.bin"
test ! -e "$D/newdir/g.bin"
rmdir "$M/newdir"
test ! -e "$M/newdir"
rmdir "$M/tree/empty"
test ! -e "$M/tree/empty"
rm -r "$M/tree"
test ! -e "$D/tree/one.txt"
# A directory renamed (its objects and its marker copied, then deleted) and chmod-ed.
mkdir "$M/d1"
echo x > "$M/d1/f"
mv "$M/d1" "$M/d2"
test "$(cat "$M/d2/f")" = x
test "$(cat "$D/d2/f")" = x
test ! -e "$D/d1/f"
chmod 700 "$M/d2"
chmod 600 "$M/d2/f"
echo ALL OK
"#;
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .env("M", &mnt)
        .env("D", &data)
        .env("W", &work)
        .output()
        .unwrap();
    let logs = format!(
        "--- s3fs log\n{}\n--- gateway log\n{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        gw.log()
    );
    assert_all_ok("s3fs-fuse on pages3", &out, &logs);
    drop(fuse);
    assert!(!mounted(&mnt), "unmounted");
}
