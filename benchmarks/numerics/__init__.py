"""The parts of benchmarks/measure_numerics.py (the driver: its command line, `measure`, the JSON),
one job a module; what the probes are and what each family measures is in the driver's docstring.

  probes     the operand types and the controlled probes (step, ladder, operand): dot products
             with chosen products, exact in their type
  engines    the engines measured: GPU adapters (cuBLAS, cuBLASLt, Triton, int8) and the emulated
             ones of the CPU dry run, each an `Adapter`
  fits       the candidate datapaths (grids of the float64 emulator's parameters), `fit` and
             `measure_engine`: every datapath that reproduces every probe output
  families   the measurements not fitted to the emulator: split-K, int8, activations, envelope
  summary    what a run concludes and prints: the summary constants, failures, the report, the
             lines for oracle.judging.hardware_numerics.HW
Imports run one way: probes <- engines <- fits; families reads probes and engines; summary reads
fits. Nothing here imports the driver.
"""
