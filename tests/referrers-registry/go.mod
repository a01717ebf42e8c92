// The test environment's registry with the OCI 1.1 referrers API (scripts/install-deps.sh
// builds it into .tools/referrers-registry-v0.22.1/): go-containerregistry's pkg/registry.
module koord-bundle.test/referrers-registry

go 1.25.0

require github.com/google/go-containerregistry v0.22.1
