module epd.local/echo

go 1.24
