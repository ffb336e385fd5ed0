//! The Kubernetes client: from an explicit kubeconfig, else in-cluster or the default kubeconfig.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::Error;

pub async fn build_client(kubeconfig: Option<&Path>) -> Result<Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig_err = |source| Error::Kubeconfig {
                path: path.display().to_string(),
                source,
            };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_err)?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(kubeconfig_err)?
        }
        None => Config::infer().await.map_err(Error::InferConfig)?,
    };
    Client::try_from(config).map_err(Error::Client)
}
