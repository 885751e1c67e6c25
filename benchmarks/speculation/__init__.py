"""The parts of `bench_spec_decode.py`: its drafters and methods (`drafters.py`), its workloads and
how it serves and times them (`serving.py`)."""
