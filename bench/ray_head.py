"""A Ray head for the benchmarks to join (``--ray-address``): started beforehand, as a running
cluster is, so that Ray's own start is not in the timed command (issue 34 goal 4).

    CUDA_VISIBLE_DEVICES=0,1,2,3 python bench/ray_head.py ADDRESS_FILE --gpus 4 [--cpus N]

Starts a local instance with that many GPUs (and CPUs, default Ray's count), writes its GCS
address to ADDRESS_FILE once it is up (atomically: a reader never sees half of it), and stays
until it is interrupted or killed. Used by bench/scale_gpu.py and bench/devices_host.sh.
"""

import argparse
import os
import time

import ray


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("address_file")
    p.add_argument("--gpus", type=int, default=0)
    p.add_argument("--cpus", type=int)
    a = p.parse_args()
    ray.init(address="local", num_gpus=a.gpus, num_cpus=a.cpus, include_dashboard=False,
             _system_config={"worker_niceness": 0})
    with open(a.address_file + ".tmp", "w") as f:
        f.write(ray.get_runtime_context().gcs_address)
    os.replace(a.address_file + ".tmp", a.address_file)
    try:
        while True:
            time.sleep(60)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
