"""What tests, benchmarks and scripts share: mock and broken upstreams, fault drills, the routing
evaluation set, tiny scripted checkpoints, gateway and Redis processes, load generators and the
client-behaviour probe. It imports the product; neither `tests` nor `benchmarks`."""
