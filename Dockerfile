# Production image of the autodl server: API, web app and scheduler in one binary.
FROM rust:1.95-bookworm AS build
RUN rustup target add wasm32-unknown-unknown \
 && cargo install wasm-bindgen-cli --version 0.2.130
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p autodl-server --no-default-features \
 && cargo build --profile wasm-release --locked -p autodl-frontend --lib --target wasm32-unknown-unknown --features hydrate \
 && mkdir -p /out/site/pkg \
 && wasm-bindgen --target web --no-typescript --remove-name-section --out-dir /out/site/pkg --out-name autodl \
      target/wasm32-unknown-unknown/wasm-release/autodl_frontend.wasm \
 && cp style/main.css /out/site/pkg/autodl.css \
 && gzip -9 -k /out/site/pkg/autodl_bg.wasm /out/site/pkg/autodl.js /out/site/pkg/autodl.css \
 && cp target/release/autodl-server /out/

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl && rm -rf /var/lib/apt/lists/* \
 && useradd --system --home /var/lib/autodl --create-home autodl
COPY --from=build /out/autodl-server /usr/local/bin/autodl-server
COPY --from=build /out/site /usr/share/autodl/site
USER autodl
WORKDIR /var/lib/autodl
ENV AUTODL_LISTEN=0.0.0.0:8080 \
    AUTODL_SITE_ROOT=/usr/share/autodl/site \
    RUST_LOG=info
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1
ENTRYPOINT ["autodl-server"]
CMD ["serve"]
