# The operator's image: `docker build -t stateward:dev .` (or any OCI builder).
#
# Build stage: the `stateward` binary and the service plugins (scripts/build-plugins, Wasm
# components for wasm32-wasip2). The binary links only glibc (libc, libm) and libgcc_s, no
# OpenSSL (TLS is rustls/ring), so the run stage is a distroless glibc base: no shell, no
# package manager, the nonroot user 65532.
#
# Run stage: the binary, the built-in plugins and the shipped policy bundle, read-only, owned by
# root; the process runs as 65532 and writes only to the volumes deploy/operator/deployment.yaml
# mounts (the precompiled-plugin cache, the audit log, /tmp), so the root file system can be
# mounted read-only.
#
# tests/cluster/operator-image builds the same image without a container engine for the
# local real-pods cluster; the realpods test `in_cluster` checks that the files this run stage
# COPYs are exactly the files of that image's application layer. Keep the COPY lines of the
# run stage one source and one destination each.

FROM rust:1.95-bookworm AS build
RUN rustup target add wasm32-wasip2
WORKDIR /src
COPY . .
RUN cargo build --locked --release -p stateward --bin stateward \
 && CARGO_TARGET_DIR=target scripts/build-plugins

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/stateward /usr/local/bin/stateward
COPY --from=build /src/target/plugins/postgres.wasm /opt/stateward/plugins/postgres.wasm
COPY --from=build /src/target/plugins/redis.wasm /opt/stateward/plugins/redis.wasm
COPY --from=build /src/target/plugins/elasticsearch.wasm /opt/stateward/plugins/elasticsearch.wasm
COPY policies/ /opt/stateward/policies/
USER 65532:65532
EXPOSE 8080 9443
ENTRYPOINT ["/usr/local/bin/stateward"]
CMD ["run"]
