"""Statistics over scored rows, without a model: systems compared (comparison), agreement with human ratings
(agreement)."""
