"""The app layer of this repository's own Flower app: the run config (declared keys,
validation), the dataset and strategy registries, records and the strategies' run-config
wiring. Built on the library (fedgo_flwr); the library never imports it."""
