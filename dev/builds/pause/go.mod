module epd.local/pause

go 1.24
