//! The controller's Kubernetes client: kube's default stack (as `Client::try_default` builds
//! it) with each HTTP/1 connection's read buffer capped at [`READ_BUFFER_MAX`].
//!
//! hyper grows a connection's read buffer while reads fill it (up to about 400 KB) and keeps it
//! for as long as the connection lives. During an install the controller holds some 35
//! connections to the API server (32 writes, the watch, Events, the Lease): a heap profile at
//! 20,000 nodes found 8.7 MB of read buffers at the peak, the largest single item. Bodies are
//! streamed, so a smaller buffer only means more, smaller reads; 32 KiB is two TLS records.
//!
//! Everything else is kube's own layers, in kube's order: TLS, the connect, read and write
//! timeouts, the base URI, retries of 5xx, authentication (with its token refresh), extra
//! headers. Left out: kube's request tracing spans (debug level). A proxy in the kubeconfig
//! takes kube's default stack unchanged.
//!
//! Owns: how the controller's client is built. The commands (`explain`, `tree`, `plan`,
//! `uninstall`) use kube's default.

use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::{Builder, connect::HttpConnector},
    rt::TokioExecutor,
};
use kube::{
    Client, Config,
    client::{ConfigExt, retry::RetryPolicy},
};
use tower::{BoxError, ServiceBuilder, retry::RetryLayer};

/// The most a connection buffers of what it reads (hyper's default is about 400 KB).
pub const READ_BUFFER_MAX: usize = 32 * 1024;

/// The client, from the environment as `Client::try_default` infers it.
pub async fn client() -> kube::Result<Client> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    from_config(config)
}

/// The client for `config`.
pub fn from_config(config: Config) -> kube::Result<Client> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = Builder::new(TokioExecutor::new())
        .http1_max_buf_size(READ_BUFFER_MAX)
        .build::<_, kube::client::Body>(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use kube::Api;
    use serde_json::json;

    /// A list far larger than the read buffer arrives whole: bodies stream through the capped
    /// buffer.
    #[tokio::test]
    async fn a_response_larger_than_the_read_buffer_arrives_whole() {
        let filler = "x".repeat(4096);
        let items: Vec<_> = (0..300)
            .map(|i| json!({ "metadata": { "name": format!("node-{i}"), "labels": { "filler": filler } } }))
            .collect();
        let body = json!({ "apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items })
            .to_string();
        assert!(body.len() > 30 * READ_BUFFER_MAX, "{} bytes", body.len());
        let app = axum::Router::new().route(
            "/api/v1/nodes",
            axum::routing::get(move || {
                let body = body.clone();
                async move { ([("content-type", "application/json")], body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = Config::new(format!("http://{addr}").parse().unwrap());
        let nodes: Api<Node> = Api::all(from_config(config).unwrap());
        let list = nodes.list(&Default::default()).await.unwrap();
        assert_eq!(list.items.len(), 300);
        assert_eq!(
            list.items[299].metadata.labels.as_ref().unwrap()["filler"].len(),
            4096
        );
    }
}
