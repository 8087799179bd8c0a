"""The GPU check: one command that runs specdec's GPU path stage by stage on one device.

``python -m bench.gpu_check --out DIR`` runs, in order (``run.STAGES``):

- ``tiny.*`` (``tiny``): the tiny random pair built from configs at run time, on the device: the
  float64 and float32 engine (strict greedy SD and ASD with budget 0 equal plain greedy, token
  for token), the target and drafter actors' classes without Ray, 20 steps of drafter training
  and 20 of pre-verifier training;
- ``model.*`` (``model``): the served target (SmolLM2 from its GGUF, or the tiny target with
  ``--tiny``): plain AR and the served default SD, tokens/s and their ratio, and in float32 and
  bfloat16 how many outputs equal plain decoding's (where not: the first differing position and
  the target's logit margin there);
- ``train.*`` (``training``): with the time left, responses generated there, a shortened drafter
  training on them and its accepted length against the committed drafter's.

After every stage the whole report is written to ``DIR/gpu_check.json`` (``report``): a stage
that fails records its error and traceback, and the stages that do not depend on it still run.
``bring`` packs what a bare machine lacks (the GGUF in parts, wheels, the suffix trees' C++
source) and unpacks it there, with the standard library alone. docs/GPU.md says how to run it.

What it is not: a benchmark of record (few prompts, one run) or a test of served HTTP; it needs
no Ray, MLflow or network.
"""
