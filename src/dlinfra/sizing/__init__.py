"""The sizing advisor: how many workers and parameter servers a spec should have, predicted from its
model's bytes, its devices' step time and its links (`dlinfra advise`, and a summary in `plan` and
`validate`), and checked against every run's measured throughput (`advise --history`)."""
