# One Dockerfile, two images:
#   docker build --target petstore-server   -t petstore-server .
#   docker build --target petstore-operator -t petstore-operator .
# Both binaries come from one cargo build, so the dependency layer and the
# cache mounts are shared, and a rebuild compiles only what changed.

ARG RUST_VERSION=1.95
# release for images you ship; the Tiltfile asks for dev-image (Cargo.toml),
# which compiles an edit unoptimised. The images carry it as a label.
ARG CARGO_PROFILE=release

FROM rust:${RUST_VERSION}-slim-bookworm AS build
ARG CARGO_PROFILE
WORKDIR /src
# Manifests first: this layer (and cargo's fetch) stays cached until a
# Cargo.toml or Cargo.lock changes.
COPY Cargo.toml Cargo.lock build.rs ./
COPY operator/Cargo.toml operator/
COPY petstore-server/Cargo.toml petstore-server/
COPY telemetry/Cargo.toml telemetry/
COPY process/Cargo.toml process/
COPY tls/Cargo.toml tls/
# The workspace's other members (test fixtures, end-to-end tests, benchmarks,
# developer commands) are not in the images, but cargo must load the whole
# workspace: their manifests come with empty targets.
COPY tests/fixtures/Cargo.toml tests/fixtures/
COPY tests/e2e/Cargo.toml tests/e2e/
COPY benches/Cargo.toml benches/
COPY xtask/Cargo.toml xtask/
RUN mkdir -p src operator/src petstore-server/src telemetry/src process/src tls/src tests/fixtures/src tests/e2e/bin benches/src xtask/src \
 && touch src/lib.rs operator/src/lib.rs petstore-server/src/lib.rs telemetry/src/lib.rs process/src/lib.rs tls/src/lib.rs tests/fixtures/src/lib.rs benches/src/lib.rs tests/e2e/main.rs xtask/src/lib.rs \
 && for main in operator/src/main.rs petstore-server/src/main.rs tests/e2e/bin/petstore-operator-faults.rs \
                benches/src/main.rs xtask/src/main.rs; do echo 'fn main() {}' > "$main"; done
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo fetch --locked
COPY proto proto
COPY src src
COPY operator operator
COPY petstore-server petstore-server
COPY telemetry telemetry
COPY process process
COPY tls tls
# The registry and target caches persist across builds (BuildKit), so an
# edit recompiles only the crates it touches.
# cargo judges freshness by mtime, but the target cache outlives the sources:
# a checkout older than the last build (another worktree, say) would get that
# build's binaries, and BuildKit would then keep them as this source's layer.
# So each crate's files get a new mtime when their content differs from the
# last successful build's of this profile, and an old one when it is the
# same. The record is dropped before building, so a failed build leaves none
# to trust.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -e; \
    for part in build.rs src proto operator petstore-server telemetry process tls; do \
      sum=$(find "$part" -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1); \
      if [ "$(cat "target/.sources-${CARGO_PROFILE}-$part" 2>/dev/null)" = "$sum" ]; then \
        find "$part" -exec touch -h -d @1 {} +; \
      else \
        find "$part" -exec touch -h {} +; \
      fi; \
      rm -f "target/.sources-${CARGO_PROFILE}-$part"; \
      echo "$sum" > "target/.sources-${CARGO_PROFILE}-$part.next"; \
    done; \
    cargo build --locked --profile "${CARGO_PROFILE}" -p petstore-server -p petstore-operator --bins \
 && for next in target/.sources-"${CARGO_PROFILE}"-*.next; do mv "$next" "${next%.next}"; done \
 && mkdir -p /out \
 && cp "target/${CARGO_PROFILE}/petstore-server" "target/${CARGO_PROFILE}/petstore-operator" /out/

# distroless/cc has glibc and libgcc and nothing else; :nonroot runs as 65532.
FROM gcr.io/distroless/cc-debian12:nonroot AS petstore-server
ARG CARGO_PROFILE
LABEL com.example.petstore.cargo-profile="${CARGO_PROFILE}"
COPY --from=build /out/petstore-server /usr/local/bin/petstore-server
USER 65532:65532
EXPOSE 6742 9090
ENTRYPOINT ["/usr/local/bin/petstore-server"]

FROM gcr.io/distroless/cc-debian12:nonroot AS petstore-operator
ARG CARGO_PROFILE
LABEL com.example.petstore.cargo-profile="${CARGO_PROFILE}"
COPY --from=build /out/petstore-operator /usr/local/bin/petstore-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/petstore-operator"]
