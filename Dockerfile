# Herald's container image: a release build of the `herald` binary on a
# small runtime image (distroless, with the C runtime libraries it links
# against: libc, libm, libgcc_s), running as a non-root user, the data
# directory a volume. docs/operations.md ("Deploying", container) explains
# the settings, and what of this file is tested and how.
#
#   docker build -t herald .    (podman build --format docker -t herald .:
#                                the OCI format drops HEALTHCHECK)
#   docker run -p 7700:7700 -v herald-data:/var/lib/herald \
#       -v "$PWD/herald.toml:/etc/herald/herald.toml:ro" \
#       -e HERALD_CONFIG=/etc/herald/herald.toml herald
#   (listening off loopback, a node refuses to start without [auth])
#
# The base images are arguments, for a mirror or a pinned digest. The
# build image's Debian release must be the runtime image's (the binary
# needs a glibc as old as the one it was linked against or newer), and its
# Rust at least the newest rust-version of Cargo.lock's crates (1.92).
ARG BUILD_IMAGE=docker.io/library/rust:1.92-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
# .dockerignore keeps target/, node_modules and virtualenvs out.
COPY . .
RUN cargo build --release --locked -p herald \
    && mkdir -p /out/usr/local/bin /out/var/lib/herald \
    && cp target/release/herald /out/usr/local/bin/herald \
    && chown 65532:65532 /out/var/lib/herald \
    && chmod 0750 /out/var/lib/herald

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/ /
# The distroless image's `nonroot` user; no shell, no package manager.
USER 65532:65532
ENV HERALD_LISTEN=0.0.0.0:7700 \
    HERALD_DATA_DIR=/var/lib/herald \
    HERALD_LOG_FORMAT=json
# The embedded SQLite database and the node id live here; with PostgreSQL
# (HERALD_DATABASE_URL) only the node id does.
VOLUME ["/var/lib/herald"]
EXPOSE 7700
# `herald ready` asks GET /readyz of the node in the container (HERALD_SERVER,
# default http://127.0.0.1:7700): exit 0 on 200. With TLS on, set
# HERALD_SERVER=https://127.0.0.1:7700 and HERALD_CA_FILE.
HEALTHCHECK --interval=10s --timeout=6s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/herald", "ready"]
# SIGTERM drains (docs/operations.md); give it --drain-timeout plus the
# lease release: docker stop --time 20.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/herald"]
CMD ["serve"]
