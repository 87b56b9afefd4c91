# Multi-stage build of the single static-ish binary; the runtime image holds nothing else.
# Built from the locked dependencies (Cargo.lock) so the image is reproducible.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN cargo build --release --locked && strip target/release/local-static-provisioner

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /src/target/release/local-static-provisioner /usr/local/bin/local-static-provisioner
# The DaemonSet runs it privileged as root to read mounts and block devices.
USER 0:0
ENTRYPOINT ["/usr/local/bin/local-static-provisioner"]
CMD ["run"]
