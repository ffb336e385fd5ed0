//! A `moto_server` on a free loopback port with a VPC and two subnets made through moto's own
//! EC2, for the AWS provider's run: it talks to nothing but this server.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Moto {
    child: Child,
    pub url: String,
    pub subnets: Vec<String>,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `python` is the venv's; `moto_server` sits beside it.
pub fn start(python: &Path) -> Result<Moto, String> {
    let server = python.with_file_name("moto_server");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", server.display()))?;
    let mut moto = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
        subnets: Vec::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err("moto_server did not listen within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let script = format!(
        r#"
import boto3, json
ec2 = boto3.client("ec2", endpoint_url="{url}", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
print(json.dumps([ec2.create_subnet(VpcId=vpc, CidrBlock=c, AvailabilityZone=z)["Subnet"]["SubnetId"]
                  for c, z in (("10.0.1.0/24", "us-east-1a"), ("10.0.2.0/24", "us-east-1b"))]))
"#,
        url = moto.url
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "setting up EC2 in moto failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    moto.subnets = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(moto)
}
