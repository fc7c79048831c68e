"""Statistics over scored rows, without a model: systems compared (comparison), agreement with human ratings
(agreement), rows set side by side (row_diff). May import core/ only: no model, no engine."""
