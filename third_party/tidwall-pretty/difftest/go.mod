module github.com/tokengate/tokengate/third_party/tidwall-pretty/difftest

go 1.24

require github.com/tidwall/pretty v1.2.0
