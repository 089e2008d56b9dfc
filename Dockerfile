# One image for the nicop operator and every node agent; the first argument picks the process:
#   nicop operator | driver | rdma-device-plugin | sriov-device-plugin | sriov-config-daemon | ...
# Build it from the root of the source tree and push it where the nodes can pull from:
#   docker build -t registry.example.com/nicop:0.1.0 .
FROM python:3.11-slim

# kmod (modprobe, rmmod, depmod, modinfo): the driver agent loads and unloads kernel modules.
RUN apt-get update \
    && apt-get install -y --no-install-recommends kmod \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The package from this source tree, with its dependencies from PyPI. The build directory is
# removed afterwards, so the image holds the installed package only.
COPY pyproject.toml README.md /build/
COPY src/ /build/src/
RUN pip install /build && rm -rf /build

# No USER: the node agents run privileged as root (sysfs, /dev, netlink, kernel modules). The
# operator does not need root; the Helm chart runs it as UID 65532 with a read-only root
# filesystem.
WORKDIR /
ENTRYPOINT ["nicop"]
CMD ["--help"]
