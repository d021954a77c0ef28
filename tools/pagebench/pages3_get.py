# GetObject throughput through pages3 with boto3 (docs/BENCHMARKS.md): N threads, each its own client.
# usage: bench_pages3.py ENDPOINT KEY SECRET PREFIX COUNT THREADS SECONDS
import sys, time, threading, boto3
from botocore.config import Config
ep, key, secret, prefix, count, threads, secs = sys.argv[1:8]
count, threads, secs = int(count), int(threads), float(secs)
cfg = Config(s3={"addressing_style": "path"}, region_name="us-east-1",
             max_pool_connections=4, retries={"max_attempts": 1})
done_bytes = [0] * threads
done_reqs = [0] * threads
stop = time.monotonic() + secs
def worker(i):
    s3 = boto3.session.Session().client("s3", endpoint_url=ep, aws_access_key_id=key,
                                        aws_secret_access_key=secret, config=cfg)
    j = i
    while time.monotonic() < stop:
        b = s3.get_object(Bucket="data", Key="%s/o%05d" % (prefix, j % count))["Body"].read()
        done_bytes[i] += len(b)
        done_reqs[i] += 1
        j += threads
t0 = time.monotonic()
ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
dt = time.monotonic() - t0
print("%s threads=%d  %.1f MB/s  %.0f req/s  (%d requests in %.1f s)" % (
    prefix, threads, sum(done_bytes) / dt / 1e6, sum(done_reqs) / dt, sum(done_reqs), dt))
