module github.com/fleetd/fleet

go 1.26.8
