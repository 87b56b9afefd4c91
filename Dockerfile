# Reproducible multi-stage build from the locked dependencies (Cargo.lock).
#   docker build -t local-static-provisioner .                 # minimal image: the binary only
#   docker build -t local-static-provisioner:full --target full .   # + shell, util-linux and
#                                                               #   upstream's /scripts, for
#                                                               #   external blockCleanerCommands
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
# `version` and the build-info metric: the build context has no .git, so pass the commit
# (docker build --build-arg LSP_GIT_COMMIT=$(git rev-parse --short=12 HEAD)); the build date is
# SOURCE_DATE_EPOCH when given (reproducible builds), else the time of the build.
ARG LSP_GIT_COMMIT=unknown
ARG SOURCE_DATE_EPOCH
ENV LSP_GIT_COMMIT=$LSP_GIT_COMMIT SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH
COPY scripts/sbom.sh ./scripts/sbom.sh
# The release profile (Cargo.toml) strips the binary. Every build also writes its SBOM
# (CycloneDX JSON of every crate the binary links), shipped in the image below.
RUN cargo build --release --locked && bash scripts/sbom.sh

# Variant for clusters whose ConfigMap points blockCleanerCommand at upstream's scripts.
FROM debian:bookworm-slim AS full
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux coreutils e2fsprogs \
 && rm -rf /var/lib/apt/lists/*
COPY deploy/scripts/ /scripts/
COPY --from=build /src/target/release/local-static-provisioner /usr/local/bin/local-static-provisioner
COPY --from=build /src/target/release/local-static-provisioner.cdx.json /usr/share/doc/local-static-provisioner/sbom.cdx.json
ENTRYPOINT ["/usr/local/bin/local-static-provisioner"]
CMD ["run"]

# Default: nothing but the binary (all built-in wipes need no shell or external tool).
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /src/target/release/local-static-provisioner /usr/local/bin/local-static-provisioner
COPY --from=build /src/target/release/local-static-provisioner.cdx.json /usr/share/doc/local-static-provisioner/sbom.cdx.json
# The DaemonSet runs it privileged as root to read mounts and block devices.
USER 0:0
ENTRYPOINT ["/usr/local/bin/local-static-provisioner"]
CMD ["run"]
