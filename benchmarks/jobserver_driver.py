"""Inside one hardened sandbox container (run by benchmarks/jobserver.py; standard library
only): start the job server from the file tree `FILES`, feed it `N` rounds of the jobs in
the JOBS environment variable one at a time, and print one JSON line: the container's CPU
time per job (its cgroup's usage, less this driver's own), wall time per job, the outcomes,
and how many jobs did not end clean.

    python3 jobserver_driver.py FILES N BASE_UID
"""

import json
import os
import resource
import subprocess
import sys
import time


def cgroup_cpu_s():
    """CPU seconds of this container's cgroup (v1 cpuacct or v2 cpu.stat)."""
    try:
        with open("/sys/fs/cgroup/cpuacct/cpuacct.usage") as f:
            return int(f.read()) / 1e9
    except OSError:
        with open("/sys/fs/cgroup/cpu.stat") as f:
            for line in f:
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) / 1e6
    raise OSError("no cgroup CPU counter in this container")


def own_cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def serve(proc, job_line):
    """One job: its outcome, and whether its `clean` event said clean."""
    proc.stdin.write(job_line)
    proc.stdin.flush()
    outcome = "no result"
    while True:
        line = proc.stdout.readline()
        if not line:
            return "the server ended", False
        event = json.loads(line)
        if event["event"] == "result":
            outcome = event["outcome"]
        elif event["event"] in ("clean", "lost"):
            return outcome, bool(event.get("clean"))


def main(files, n, base_uid):
    boot = f"import sys; sys.path.insert(0, {files!r}); import jobserver; jobserver.entry()"
    argv = ["python3", "-I", "-S", "-c", boot, "--container", "--base-uid", base_uid]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    lines = [(json.dumps(job) + "\n").encode() for job in json.loads(os.environ["JOBS"])]
    for line in lines:  # warm-up, not counted
        serve(proc, line)
    outcomes, unclean = {}, 0
    c0, m0, t0 = cgroup_cpu_s(), own_cpu_s(), time.perf_counter()
    for _ in range(n):
        for line in lines:
            outcome, clean = serve(proc, line)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            unclean += not clean
    c1, m1, t1 = cgroup_cpu_s(), own_cpu_s(), time.perf_counter()
    proc.stdin.close()
    proc.wait(timeout=30)
    jobs = n * len(lines)
    print(json.dumps({
        "jobs": jobs, "cpu_ms": 1000 * ((c1 - c0) - (m1 - m0)) / jobs,
        "wall_ms": 1000 * (t1 - t0) / jobs, "outcomes": outcomes, "unclean": unclean,
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
