"""examples/llama/generate.py under mpiexec, for tests/test_example_llama_tp.py: the command line as given (or,
with LLAMA_TP_RUNS, a JSON list of command lines run one after the other, each exit status printed by rank 0), and
with LLAMA_TP_DIE_RANK=r and LLAMA_TP_DIE_STEP=s, rank r leaves with os._exit(3) (no MPI_Finalize: a crash that
exits) when it draws the random number of its step s, i.e. mid-generation, after its earlier steps' collectives."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "examples", "llama"))

import generate  # noqa: E402
import llama_model  # noqa: E402

die_rank = int(os.environ.get("LLAMA_TP_DIE_RANK", "-1"))
die_step = int(os.environ.get("LLAMA_TP_DIE_STEP", "0"))
if die_rank == generate.mpi_rank():
    draw = llama_model.Sampling.random_val
    steps = [0]

    def random_val(self):
        steps[0] += 1
        if steps[0] == die_step:
            os._exit(3)
        return draw(self)

    llama_model.Sampling.random_val = random_val

if "LLAMA_TP_RUNS" in os.environ:
    import json
    for argv in json.loads(os.environ["LLAMA_TP_RUNS"]):
        status = generate.main(argv)
        if generate.mpi_rank() == 0:
            print(f"exit {status}", flush=True)
    sys.exit(0)
sys.exit(generate.main(sys.argv[1:]))
