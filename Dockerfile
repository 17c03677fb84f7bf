# The image the Kubernetes manifests (scripts/make_tfjob.py) name: ps-trainer installed
# for the CPU, run as `python trainer.py ...` from its working directory by every task.
#
#   docker build -t registry.example/ps-trainer:1 .
#   docker build --build-arg BASE_IMAGE=<a local Debian 12 image with python3> -t ps-trainer:1 .
#
# The base needs Python 3.10 or newer as `python` (python:*-slim has it; Debian's own images need
# python3, python3-venv and python-is-python3).
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# A virtual environment: Debian's own Python refuses installs into the system (PEP 668).
RUN python -m venv /opt/venv

WORKDIR /opt/ps-trainer
COPY pyproject.toml setup.cfg README.md trainer.py ./
COPY flags/ flags/
COPY model/ model/
COPY input/ input/
COPY cluster/ cluster/
COPY training/ training/
COPY launch/ launch/
COPY ps_trainer/ ps_trainer/
COPY scripts/ scripts/
# Not root: a trainer needs no privilege. model_dir is a mounted volume it must be able to write.
RUN pip install --no-cache-dir ./[cpu] \
    && useradd --create-home --uid 1000 trainer
USER 1000

EXPOSE 2222
ENTRYPOINT ["python", "trainer.py"]
