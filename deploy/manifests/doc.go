// Package manifests holds no code: its tests validate the deployment manifests in
// deploy/compose (with github.com/compose-spec/compose-go/v2: the Compose Specification's
// JSON schema its schema package embeds, and its loader, as `docker compose config` loads
// the file) and deploy/kubernetes
// (rendered with kustomize, decoded strictly into the k8s.io/api types), and check what
// a schema cannot: that names, labels, ports, volumes, secrets and BANDPLANE_* variables
// refer to something that exists. Neither set of manifests is run here: no container
// engine or cluster is available on the machines this repository is built on.
//
// It may import any folder but cmd/ (deploy/layers).
package manifests
